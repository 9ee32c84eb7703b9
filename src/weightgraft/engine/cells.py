"""Exact cell maps: the effect on a metric of grafting single cells, or sets of cells, computed
with the engine (integer grafts, no approximation).

A cell is ``(position, slot)``: one slot (``embed``, ``layers.{i}.{component}``, ``final_norm``,
``unembed``) at one token position. ``final_norm`` and ``unembed`` act on a position's own
logits only, so they are cells at the scored position alone. Grafting a set of cells from the
donor into the base changes only positions from the set's first position on: with prefix
sharing (``weightgraft.engine.prefix``) the positions before it run once per (example, first
position) and each set recomputes only from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine.architectures import model_slots
from weightgraft.engine.attribution import Metric, metric_values
from weightgraft.engine.prefix import GraftItem, prefix_forward

__all__ = ["Cell", "ScoredExample", "exact_effects", "example_cells", "group_cells"]

OUTPUT_ONLY = ("final_norm", "unembed")


@dataclass(frozen=True)
class Cell:
    """One slot at one position."""

    position: int
    slot: int  # index into ``slots(model)``


@dataclass(frozen=True)
class ScoredExample:
    """A prompt scored at one position: the metric is read from the logits there."""

    input_ids: tuple[int, ...]
    position: int  # the scored position (usually the last prompt token)
    target: int
    distractor: int | None = None


def example_cells(model: nn.Module, example: ScoredExample) -> list[Cell]:
    """Every cell that can change the example's metric: each layer slot and ``embed`` at every
    position up to the scored one, ``final_norm`` / ``unembed`` at the scored position."""
    names = [s.name for s in model_slots(model)]
    cells = []
    for t in range(example.position + 1):
        for s, name in enumerate(names):
            if name not in OUTPUT_ONLY or t == example.position:
                cells.append(Cell(t, s))
    return cells


def group_cells(model: nn.Module, example: ScoredExample, positions: Sequence[int], layers: Sequence[int],
                components: Sequence[str]) -> list[Cell]:
    """The cells of a group: a position span x a layer range x a component set (``embed``,
    ``final_norm``, ``unembed`` name the global slots; output-only ones count at the scored
    position only). Pass the list as one set to ``exact_effects`` for the group's exact effect."""
    wanted_layers, wanted = set(layers), set(components)
    chosen = []
    for c in example_cells(model, example):
        if c.position not in positions:
            continue
        name = model_slots(model)[c.slot].name
        if name.startswith("layers."):
            _, layer, comp = name.split(".", 2)
            if int(layer) in wanted_layers and comp in wanted:
                chosen.append(c)
        elif name in wanted:
            chosen.append(c)
    return chosen


def _item(example: ScoredExample, cells: Sequence[Cell], n_slots: int) -> GraftItem:
    n = example.position + 1
    source = torch.zeros(n, n_slots, dtype=torch.long)
    for c in cells:
        if c.position >= n:
            raise ValueError(f"cell at position {c.position} is after the scored position {example.position}")
        source[c.position, c.slot] = 1
    return GraftItem(input_ids=example.input_ids[:n], source=source, logit_start=example.position, n_logits=1)


def _suffix(item: GraftItem) -> int:
    """Positions an item recomputes: from its first grafted position to its scored one."""
    grafted = item.source.any(dim=1).nonzero()
    first = int(grafted[0]) if len(grafted) else item.logit_start
    return item.logit_start - first


@torch.no_grad()
def exact_effects(
    models: Sequence[nn.Module], examples: Sequence[ScoredExample],
    cell_sets: Sequence[Sequence[Sequence[Cell]]], pad_id: int, metric: Metric = "logprob",
    chunk: int = 512, share: bool = True,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(base metric [n_examples], [effects [len(cell_sets[i])] per example])``: the effect of
    grafting each set of cells of ``cell_sets[i]`` from ``models[1]`` into ``models[0]`` in
    example i, ``M(graft) - M(base)``. ``kl`` is measured against the donor's distribution."""
    if len(models) != 2:
        raise ValueError("exact cell effects need exactly two models: [base, donor]")
    if len(cell_sets) != len(examples):
        raise ValueError("give one list of cell sets per example")
    n_slots = len(model_slots(models[0]))
    items: list[GraftItem] = []
    owner: list[int] = []
    for i, (ex, sets) in enumerate(zip(examples, cell_sets)):
        items.append(_item(ex, [], n_slots))  # the base itself
        owner.append(i)
        if metric == "kl":
            donor = _item(ex, [], n_slots)
            items.append(GraftItem(donor.input_ids, torch.ones_like(donor.source), logit_start=ex.position))
            owner.append(i)
        for cells in sets:
            items.append(_item(ex, cells, n_slots))
            owner.append(i)
    # Batches of items with similar suffixes (positions from the first grafted one on): a batch's
    # suffixes are padded to its longest, so mixing long and short ones would waste the sharing.
    order = sorted(range(len(items)), key=lambda i: (_suffix(items[i]), i))
    logits = None
    for start in range(0, len(order), chunk):
        rows = order[start : start + chunk]
        part = prefix_forward(models, [items[i] for i in rows], pad_id, share=share)[:, 0].double().cpu()
        if logits is None:
            logits = part.new_empty(len(items), part.shape[-1])
        logits[torch.tensor(rows)] = part
    targets = torch.tensor([examples[i].target for i in owner])
    distractors = None
    if metric == "logit_diff":
        if any(examples[i].distractor is None for i in owner):
            raise ValueError("metric 'logit_diff' needs a distractor on every example")
        distractors = torch.tensor([examples[i].distractor for i in owner])
    reference = None
    if metric == "kl":
        donor_rows, row = {}, 0
        for i, (ex, sets) in enumerate(zip(examples, cell_sets)):
            donor_rows[i] = row + 1
            row += 2 + len(sets)
        reference = torch.log_softmax(torch.stack([logits[donor_rows[i]] for i in owner]), -1)
    values = metric_values(logits, targets, metric, distractors, reference)
    base, effects, row = [], [], 0
    for ex, sets in zip(examples, cell_sets):
        skip = 2 if metric == "kl" else 1
        base.append(values[row])
        effects.append(values[row + skip : row + skip + len(sets)] - values[row])
        row += skip + len(sets)
    return torch.stack(base), effects
