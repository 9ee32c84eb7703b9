"""Exact expert maps: the effect on a metric of grafting one expert of one layer at one position,
for every expert the serving router picks there.

A cell is (position, layer, expert). Grafting it changes the layer's output at that position
only, so the router that serves it sees the base's pass there and picks what it picks on the
base's pass: an expert it does not pick contributes nothing whoever serves it, and its cell's
effect is exactly zero. Those cells are listed (``picked`` False, ``effect`` 0) and not run; a
sample of them is run anyway in every map (``skipped_checked``) by the per-token procedure itself,
and a map whose sampled skipped cell moves the logits at all is refused rather than returned. The picked cells run through
:func:`weightgraft.engine.cells.exact_effects_in` (integer grafts, depth sharing).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pandas as pd
import torch
from torch import nn

from weightgraft.engine.architectures import model_slots
from weightgraft.engine.attribution import Metric
from weightgraft.engine.cells import Cell, ScoredExample, exact_effects_in
from weightgraft.engine.reference import CompositeModel, per_token_forward
from weightgraft.engine.source_map import SlotName, SourceMap
from weightgraft.errors import GraftArgumentError, WeightgraftError
from weightgraft.expert_maps.picks import routing_picks

__all__ = ["COLUMNS", "SkippedCellMoved", "expert_map"]

COLUMNS = ["example", "position", "layer", "bank", "expert", "picked", "weight", "effect", "effect_plain", "computed"]
PLAIN: Metric = "first_logprob"


class SkippedCellMoved(WeightgraftError, RuntimeError):
    """An expert the serving router did not pick changed the metric: routing is coupled in a way
    the definition does not allow, so no map is returned."""


def _layer(name: str) -> int:
    layer = SlotName.parse(name).layer
    assert layer is not None  # an expert bank's slot is in a layer
    return layer


@torch.no_grad()
def _check_skipped(models: Sequence[nn.Module], example: ScoredExample, cell: Cell, banks: list,
                   composite: CompositeModel) -> None:
    """A skipped cell grafted alone by the per-token definition itself (the bank's weights of that
    expert swapped in at that position, the model's own forward run token by token) must give the
    logits of the same procedure without it, bit for bit: zero is measured, not assumed by the
    engine (which never runs an expert the router did not pick)."""
    ids = torch.tensor([example.input_ids[: example.position + 1]])
    slot = dict(banks)[cell.slot]
    source = torch.zeros(1, ids.shape[1], len(model_slots(models[0])), dtype=torch.long)
    experts = torch.zeros(1, ids.shape[1], slot.experts, dtype=torch.long)
    plain = per_token_forward(list(models), ids, SourceMap(source, experts={slot.name: experts.clone()}),
                              composite=composite)
    experts[0, cell.position, cell.unit] = 1
    grafted = per_token_forward(list(models), ids, SourceMap(source, experts={slot.name: experts}), composite=composite)
    if not torch.equal(grafted, plain):
        moved = float((grafted - plain).abs().max())
        raise SkippedCellMoved(f"expert {cell.unit} of {slot.name} at position {cell.position}, which the router did not "
                               f"pick, moved the logits by {moved:.3g}: the model's bank reads experts it did not pick, "
                               "and its expert map is refused")


def expert_map(models: Sequence[nn.Module], examples: Sequence[ScoredExample], positions: Sequence[Sequence[int]],
               *, pad_id: int, metric: Metric = "first_logprob", chunk: int = 512, check_skipped: int = 4,
               seed: int = 0) -> pd.DataFrame:
    """One row per (example, position, layer, expert) of ``positions[i]`` in example i: the
    effect of grafting that expert of ``models[1]`` into ``models[0]`` (``effect`` in ``metric``,
    ``effect_plain`` in ``first_logprob``), the routing ``weight`` of a picked expert on the base's
    pass, and whether the cell was run (``computed``). ``check_skipped`` skipped cells per map
    (chosen with ``seed``) are run too: each must leave the metric exactly as it was."""
    if len(models) != 2:
        raise GraftArgumentError("an expert map grafts one donor into one base: give [base, donor]")
    if len(positions) != len(examples):
        raise GraftArgumentError("give one list of positions per example")
    banks = [(i, s) for i, s in enumerate(model_slots(models[0])) if s.experts]
    if not banks:
        raise GraftArgumentError("this model has no expert bank: an expert map needs a mixture of experts")
    rows: list[dict] = []
    cell_sets: list[list[list[Cell]]] = []
    where: list[list[int]] = []  # per example, the row of each set
    skipped: list[tuple[int, Cell]] = []
    for i, (ex, chosen) in enumerate(zip(examples, positions)):
        bad = [p for p in chosen if not 0 <= p <= ex.position]
        if bad:
            raise GraftArgumentError(f"example {i}: position {bad[0]} is outside 0..{ex.position}")
        ids = torch.tensor([ex.input_ids[: ex.position + 1]])
        routing = routing_picks([models[0]], ids)
        sets, at = [], []
        for p in chosen:
            for s, slot in banks:
                picked = routing.picked(slot.name, slot.experts)[0, p]
                weight = {int(e): float(w) for e, w in zip(routing.experts[slot.name][0, p], routing.weights[slot.name][0, p])}
                for e in range(slot.experts):
                    rows.append({"example": i, "position": p, "layer": _layer(slot.name), "bank": slot.name, "expert": e,
                                 "picked": bool(picked[e]), "weight": weight.get(e, 0.0), "effect": 0.0,
                                 "effect_plain": 0.0, "computed": bool(picked[e])})
                    if picked[e]:
                        sets.append([Cell(p, s, e)])
                        at.append(len(rows) - 1)
                    else:
                        skipped.append((i, Cell(p, s, e)))
        cell_sets.append(sets)
        where.append(at)
    checks = random.Random(seed).sample(skipped, min(check_skipped, len(skipped)))
    composite = CompositeModel(list(models)) if checks else None
    for i, cell in checks:
        _check_skipped(models, examples[i], cell, banks, composite)  # type: ignore[arg-type]
    del composite
    _, effects = exact_effects_in(models, examples, cell_sets, pad_id=pad_id, metrics=(metric, PLAIN), chunk=chunk)
    for i, at in enumerate(where):
        for k, r in enumerate(at):
            rows[r]["effect"], rows[r]["effect_plain"] = (float(v) for v in effects[i][k])
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs["skipped_checked"] = len(checks)
    return frame
