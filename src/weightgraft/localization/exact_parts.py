"""Exact single-cell maps on disk, per group of prompts: ``parts/exact_{direction}_{n}.parquet``
(``weightgraft.resume.parts``).

Parts are keyed by the prompts they hold, not by their place in the list: a rerun reads every
part, computes only the chosen prompts no part holds (a killed run's lost group, or the new
prompts of a raised ``exact:``), and keeps the rows of the chosen prompts. Prompt content is
checked by the run's manifest (``run._claim``), so a part never holds a stale prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

from weightgraft.engine.attribution import Metric
from weightgraft.localization.examples import LocalizeExample
from weightgraft.localization.maps import exact_frame
from weightgraft.resume.parts import Parts

EXACT_GROUP = 8  # prompts per part file (the unit a killed run resumes from)
COLUMNS = ["example_id", "template", "direction", "position", "slot", "unit", "exact"]


def _cells(frame: pd.DataFrame) -> pd.DataFrame:
    if "unit" not in frame:  # parts written before units: whole cells
        frame["unit"] = -1
    return frame[COLUMNS]


def exact_stage(models: Sequence[torch.nn.Module], chosen: Sequence[LocalizeExample], direction: str,
                *, metric: Metric, pad_id: int, chunk: int, parts: Path, say: Callable[..., None],
                unit_cells: Callable[[LocalizeExample], list] | None = None) -> list[pd.DataFrame]:
    """The exact rows of the ``chosen`` prompts, computing only those no part holds yet
    (``unit_cells(example)``: the unit cells to map exactly besides every whole cell)."""
    store = Parts(parts, f"exact_{direction}_", digits=4)
    frames = [_cells(f) for f in store.frames()]
    done = set().union(*(set(zip(f["template"], f["example_id"])) for f in frames)) if frames else set()
    todo = [e for e in chosen if (e.prompt.template, e.prompt.id) not in done]
    if todo and done:
        say(f"[{direction}] exact cells: {len(chosen) - len(todo)} of {len(chosen)} prompts already computed")
    t0 = time.time()
    for start in range(0, len(todo), EXACT_GROUP):
        group = todo[start : start + EXACT_GROUP]
        units = [unit_cells(e) for e in group] if unit_cells is not None else None
        frame, _ = exact_frame(models, group, direction, metric=metric, pad_id=pad_id, chunk=chunk, unit_cells=units)
        store.add(frame)
        frames.append(frame[COLUMNS])
        say(f"[{direction}] exact cells: {min(start + EXACT_GROUP, len(todo))}/{len(todo)} prompts, {time.time() - t0:.0f}s")
    wanted = {(e.prompt.template, e.prompt.id) for e in chosen}
    kept = [f[[k in wanted for k in zip(f["template"], f["example_id"])]] for f in frames]
    return [f for f in kept if len(f)]
