"""``weightgraft experts``: the expert map of a finetune (and of its control) on a dataset's test
prompts, at the first entity and the last token, with the region grafts it is read against.

Flow: prompts (refused in one line before any model loads) -> models -> per model, the exact
expert cells (:func:`weightgraft.expert_maps.cells.expert_map`) and the region grafts (every
expert, the router alone, the whole MoE block, the whole layer stack at the region) -> tables.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from weightgraft import atomic
from weightgraft.configfile import ConfigError
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.cells import Cell, exact_effects_in, example_cells
from weightgraft.engine.source_map import SlotName
from weightgraft.expert_maps.cells import PLAIN, expert_map
from weightgraft.expert_maps.summary import REGIONS, concentration, region_of, summarize, top_cells
from weightgraft.localization.examples import LocalizeExample
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import EXPERTS_FORMAT, ExpertsManifest, ModelEntry
from weightgraft.stats.means import mean_interval

__all__ = ["ExpertsSettings", "region_grafts", "run_experts"]

# region graft -> the components it grafts at the region's tokens, every layer
REGION_GRAFTS = {"experts": ("experts",), "router": ("router",), "moe": ("router", "experts"), "all": None}


@dataclass(frozen=True)
class ExpertsSettings:
    """What an expert map is run on: the models by spec (``donors``: label -> spec, the finetune
    first, then controls), the data, templates, prompts per template, metric."""

    pre: str
    donors: Mapping[str, str]
    data: Path
    out: Path
    templates: tuple[str, ...] = ("paper_headline", "paper_qa")
    direction: str = "a2b"
    prompts: int | None = None
    metric: str = "fact_logprob"
    seed: int = 0
    record: dict[str, Any] = field(default_factory=dict)


def _positions(example: LocalizeExample) -> list[int]:
    return [p for p, label in enumerate(example.labels) if region_of(label) is not None]


def region_grafts(models: Sequence[nn.Module], examples: Sequence[LocalizeExample], *, pad_id: int,
                  metric: str) -> pd.DataFrame:
    """Per example and region, the exact effect of grafting at the region's tokens (every layer)
    the experts, the router alone, both (``moe``), and every cell there (``all``: the embedding
    and every layer slot; at the last token the final norm and unembedding too)."""
    slots = model_slots(models[0])
    sets, keys = [], []
    for ex in examples:
        mine = []
        for region in REGIONS:
            where = [p for p, label in enumerate(ex.labels) if region_of(label) == region]
            for graft, components in REGION_GRAFTS.items():
                if components is None:  # every cell at the region's tokens (at the last: its output slots too)
                    cells = [c for c in example_cells(models[0], ex.scored) if c.position in where]
                else:
                    cells = [Cell(p, s) for p in where for s, slot in enumerate(slots)
                             if (name := SlotName.parse(slot.name)).layer is not None and name.component in components]
                mine.append(cells)
                keys.append((ex.prompt.id, ex.prompt.template, region, graft))
        sets.append(mine)
    _, effects = exact_effects_in(models, [e.scored for e in examples], sets, pad_id=pad_id, metrics=(metric, PLAIN))
    values = torch.cat(effects).tolist()
    return pd.DataFrame([(*k, v[0], v[1]) for k, v in zip(keys, values)],
                        columns=["example_id", "template", "region", "graft", "effect", "effect_plain"])


def region_table(grafts: pd.DataFrame) -> pd.DataFrame:
    """Per (model, direction, template, region, graft): the mean effect over prompts with its
    interval (sufficiency: the donor's cells into PRE; necessity: PRE's cells into the donor, an
    effect the answer loses)."""
    rows = []
    keys = ["model", "direction", "template", "region", "graft"]
    for key, g in grafts.groupby(keys, sort=False):
        interval = mean_interval(g["effect"].to_numpy(dtype=float))
        rows.append({**dict(zip(keys, key)), "n_prompts": len(g),
                     "effect": interval.value, "ci_low": interval.low, "ci_high": interval.high, "level": 0.95,
                     "declined": interval.declined, "effect_plain": float(g["effect_plain"].mean())})
    return pd.DataFrame(rows)


def _map_one(models: list[nn.Module], examples: Sequence[LocalizeExample], *, pad_id: int, metric: str,
             seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    cells = expert_map(models, [e.scored for e in examples], [_positions(e) for e in examples], pad_id=pad_id,
                       metric=metric, seed=seed)  # type: ignore[arg-type]
    ids = [examples[i].prompt.id for i in cells["example"]]
    labels = [examples[i].labels[p] for i, p in zip(cells["example"], cells["position"])]
    cells = cells.assign(example_id=ids, template=[examples[i].prompt.template for i in cells["example"]],
                         label=labels, region=[region_of(x) for x in labels])
    # both directions: in an upcycled PRE every expert is one MLP, so PRE's routing is no function of
    # its router and only the finetune as base (necessity: PRE's router into it) asks whether routing matters
    grafts = [region_grafts(models, examples, pad_id=pad_id, metric=metric).assign(direction="sufficiency"),
              region_grafts(models[::-1], examples, pad_id=pad_id, metric=metric).assign(direction="necessity")]
    return cells, pd.concat(grafts, ignore_index=True)


def run_experts(settings: ExpertsSettings, examples: Sequence[LocalizeExample], pre: nn.Module,
                donors: Mapping[str, nn.Module], *, pad_id: int, say: Any = print,
                write: bool = True) -> dict[str, pd.DataFrame]:
    """Every donor's expert map and region grafts into ``pre`` (sufficiency): the raw frames
    ``expert_cells`` and ``region_grafts``, and with ``write`` the tables written to
    ``settings.out`` too (:func:`write_tables`)."""
    if not any(s.experts for s in model_slots(pre)):
        raise ConfigError("weightgraft experts: the base model has no expert bank (a mixture of experts is needed)")
    cells, grafts = [], []
    for label, donor in donors.items():
        t0 = time.time()
        c, g = _map_one([pre, donor], examples, pad_id=pad_id, metric=settings.metric, seed=settings.seed)
        cells.append(c.assign(model=label))
        grafts.append(g.assign(model=label))
        say(f"[{label}] {int(c['picked'].sum())} picked expert cells of {len(c)} mapped exactly "
            f"({c.attrs['skipped_checked']} skipped cells checked bit for bit) in {time.time() - t0:.0f}s")
    raw = {"expert_cells": pd.concat(cells, ignore_index=True), "region_grafts": pd.concat(grafts, ignore_index=True)}
    return write_tables(settings, examples, raw) if write else raw


def write_tables(settings: ExpertsSettings, examples: Sequence[LocalizeExample], raw: Mapping[str, pd.DataFrame],
                 *, excluded: int = 0, models: Mapping[str, ModelEntry] | None = None) -> dict[str, pd.DataFrame]:
    """The tables of the raw frames (the first donor of ``settings.donors`` the finetune, the rest
    beside it), written to ``settings.out`` with its manifest (:class:`~weightgraft.resume.manifests.ExpertsManifest`:
    settings, versions, prompt counts)."""
    from weightgraft.experiments.runner import versions

    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = raw["expert_cells"]
    summary = summarize(cells)
    first, *others = list(settings.donors)
    tables = {**raw, "experts": summary, "top_cells": top_cells(summary, model=first, beside=others),
              "concentration": concentration(summary), "regions": region_table(raw["region_grafts"])}
    with atomic.atomic_path(out / "expert_cells.parquet") as tmp:
        cells.to_parquet(tmp, index=False)
    for name in ("experts", "top_cells", "concentration", "regions"):
        atomic.write_text(out / f"{name}.csv", tables[name].to_csv(index=False))
    RunFolder(out).write(ExpertsManifest.model_validate({
        "format": EXPERTS_FORMAT, **_jsonable(asdict(settings)), "n_prompts": _counts(examples),
        "prompts_left_out": excluded, "models": dict(models or {}), "versions": versions()}))
    return tables


def _counts(examples: Sequence[LocalizeExample]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in examples:
        out[e.prompt.template] = out.get(e.prompt.template, 0) + 1
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value
