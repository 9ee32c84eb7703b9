"""Per-prompt maps on disk: each direction's gradient estimates (``parts/estimates_{direction}
.parquet``, then ``estimates_{direction}_{n}.parquet`` per later session that added prompts) and
exact single-cell effects (``parts/exact_{direction}_{n}.parquet`` per group of prompts;
``weightgraft.resume.parts``).

Both are keyed by the prompts they hold, not by their place in the list: a rerun reads every
file, computes only the prompts none holds (a killed run's lost group, the new prompts of a
raised ``exact:``, prompts added to the data), and keeps the rows of this run's prompts, in this
run's order. Prompt content is checked by the run's manifest (``run._claim``); each row also
carries its prompt's :func:`example_key` (its tokens, labels and what the metric contrasts its
answer with, which the other prompts of its template decide), so a prompt whose scored inputs
changed as prompts were added is computed again. Rows written before the key (no
``example_key`` column) are read as this run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from weightgraft import atomic
from weightgraft.configfile import json_digest
from weightgraft.engine.attribution import Metric
from weightgraft.engine.cells import WHOLE
from weightgraft.engine.metric_table import localize_metric
from weightgraft.localization.examples import LocalizeExample
from weightgraft.localization.maps import exact_frame
from weightgraft.resume.parts import Parts

EXACT_GROUP = 8  # prompts per part file (the unit a killed run resumes from)
COLUMNS = ["example_id", "template", "direction", "position", "slot", "unit", "exact"]
KEY = "example_key"  # the column of each row's example_key (dropped from the maps a run returns)


def example_key(example: LocalizeExample, metric: Metric) -> str:
    """What a prompt's rows depend on beyond its content: its tokens, scored position, answer
    token, labels, and the contrast ``metric`` reads (a distractor or the template's other
    answers, which prompts added to the template can change)."""
    spec, s = localize_metric(metric), example.scored
    contrast = s.distractor if spec.needs_distractor else list(s.other_answers) if spec.needs_answers else None
    return json_digest({"ids": list(s.input_ids), "position": s.position, "target": s.target,
                        "labels": list(example.labels), "contrast": contrast}, 12)


def _pairs(frame: pd.DataFrame, *more: str) -> pd.MultiIndex:
    return pd.MultiIndex.from_arrays([frame[c] for c in ("template", "example_id", *more)])


def _held(frame: pd.DataFrame, keys: dict[tuple[str, str], str]) -> pd.DataFrame:
    """The rows that belong to this run: of a prompt it maps, with its key (or written before keys)."""
    if KEY not in frame:
        return frame[_pairs(frame).isin(list(keys))]
    return frame[_pairs(frame, KEY).isin([(*p, k) for p, k in keys.items()])]


def _keyed(frame: pd.DataFrame, keys: dict[tuple[str, str], str]) -> pd.DataFrame:
    """``frame`` with each row's example key."""
    return frame.assign(**{KEY: pd.Series(keys).reindex(_pairs(frame)).to_numpy()})


def _prompts(frame: pd.DataFrame) -> set[tuple[str, str]]:
    return set(zip(frame["template"], frame["example_id"]))


def _ordered(frame: pd.DataFrame, keys: dict[tuple[str, str], str]) -> pd.DataFrame:
    """Rows in the order ``estimate_frame`` gives them for the prompts of ``keys`` in that order:
    every whole cell by prompt, then the unit cells by prompt (a prompt's rows as written)."""
    position = pd.Series(range(len(keys)), index=pd.MultiIndex.from_tuples(list(keys)))
    at = position.reindex(_pairs(frame)).to_numpy()
    return frame.iloc[np.lexsort((at, (frame["unit"] != WHOLE).to_numpy()))].reset_index(drop=True)


def estimates_stage(examples: Sequence[LocalizeExample], direction: str, *, metric: Metric, parts: Path,
                    make: Callable[[list[LocalizeExample]], pd.DataFrame]) -> tuple[pd.DataFrame, int]:
    """Every example's estimate rows of ``direction`` (``make(examples)``: a frame of theirs),
    computing only the examples no file holds, in the order a run on ``examples`` alone gives
    them; and how many were computed. The first session writes ``estimates_{direction}.parquet``,
    a later one that adds prompts a part ``estimates_{direction}_{n}.parquet``."""
    keys = {(e.prompt.template, e.prompt.id): example_key(e, metric) for e in examples}
    whole = parts / f"estimates_{direction}.parquet"
    store = Parts(parts, f"estimates_{direction}_", digits=4)
    frames: list[pd.DataFrame] = []
    done: set[tuple[str, str]] = set()
    for path in ([whole] if whole.is_file() else []) + store.paths():
        frame = pd.read_parquet(path)
        if "unit" not in frame:  # written before units: whole cells
            frame.insert(frame.columns.get_loc("slot") + 1, "unit", WHOLE)
        frame = _held(frame, keys)
        frame = frame[~_pairs(frame).isin(list(done))]  # a prompt's rows come from one file
        done |= _prompts(frame)
        frames.append(frame)
    todo = [e for e in examples if (e.prompt.template, e.prompt.id) not in done]
    if todo:
        frame = _keyed(make(todo), keys)
        if whole.is_file():
            path = store.add(frame)
        else:
            path = whole
            with atomic.atomic_path(whole) as tmp:
                frame.to_parquet(tmp, index=False)
        frames.append(pd.read_parquet(path))  # as a resumed run reads it
    frame = pd.concat([f.drop(columns=[KEY], errors="ignore") for f in frames if len(f)], ignore_index=True)
    return _ordered(frame, keys), len(todo)


def _cells(frame: pd.DataFrame) -> pd.DataFrame:
    if "unit" not in frame:  # parts written before units: whole cells
        frame["unit"] = -1
    return frame[COLUMNS + ([KEY] if KEY in frame else [])]


def exact_stage(models: Sequence[torch.nn.Module], chosen: Sequence[LocalizeExample], direction: str,
                *, metric: Metric, pad_id: int, chunk: int, parts: Path, say: Callable[..., None],
                unit_cells: Callable[[LocalizeExample], list] | None = None) -> list[pd.DataFrame]:
    """The exact rows of the ``chosen`` prompts, computing only those no part holds yet
    (``unit_cells(example)``: the unit cells to map exactly besides every whole cell)."""
    keys = {(e.prompt.template, e.prompt.id): example_key(e, metric) for e in chosen}
    store = Parts(parts, f"exact_{direction}_", digits=4)
    frames = [_held(_cells(f), keys) for f in store.frames()]
    done = set().union(*(_prompts(f) for f in frames)) if frames else set()
    todo = [e for e in chosen if (e.prompt.template, e.prompt.id) not in done]
    if todo and done:
        say(f"[{direction}] exact cells: {len(chosen) - len(todo)} of {len(chosen)} prompts already computed")
    t0 = time.time()
    for start in range(0, len(todo), EXACT_GROUP):
        group = todo[start : start + EXACT_GROUP]
        units = [unit_cells(e) for e in group] if unit_cells is not None else None
        frame, _ = exact_frame(models, group, direction, metric=metric, pad_id=pad_id, chunk=chunk, unit_cells=units)
        store.add(_keyed(frame, keys))
        frames.append(frame[COLUMNS])
        say(f"[{direction}] exact cells: {min(start + EXACT_GROUP, len(todo))}/{len(todo)} prompts, {time.time() - t0:.0f}s")
    return [f[COLUMNS] for f in frames if len(f)]
