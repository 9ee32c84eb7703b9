"""Exact cell maps: the effect on a metric of grafting single cells, or sets of cells, computed
with the engine (integer grafts, no approximation).

A cell is ``(position, slot)``: one slot (``embed``, ``layers.{i}.{component}``, ``final_norm``,
``unembed``) at one token position. ``final_norm`` and ``unembed`` act on a position's own
logits only, so they are cells at the scored position alone. Grafting a set of cells from the
donor into the base changes only positions from the set's first position on, and only layers
from its first layer on: with depth sharing (``weightgraft.engine.sharing.depth``) the base's part runs
once per example, and each set recomputes only its own positions and layers.

A unit cell is one attention head of a q/k/v/o slot or one MLP neuron of a gate/up/down slot
at one position (``Cell(position, slot, unit=k)``), grafted as ``graft_forward``'s
``head_source`` / ``neuron_source`` define it; under grouped-query attention a k/v head cell is
one shared key/value head (serving its group of q heads). ``unit=REST`` is what of a split slot
belongs to no unit: o's or down's bias, where the module has one. A slot's units and its rest
together are its whole cell. Their names (``cell_name``): ``layers.3.o/h2``, ``layers.3.up/n17``,
``layers.3.down/bias``. On a mixture of experts, a unit of the ``experts`` slot is one expert
(``layers.3.experts/e5``), grafted as ``graft_forward``'s ``expert_source`` defines it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from weightgraft.engine import lora
from weightgraft.engine.architectures import NEURON_COMPONENTS, Slot, Units, model_slots
from weightgraft.engine.attribution import Metric, metric_values
from weightgraft.engine.metric_table import localize_metric
from weightgraft.engine.sharing.depth import UNIT_BUDGET, DepthStats, Reduce, depth_forward
from weightgraft.engine.sharing.prefix import GraftItem, prefix_forward
from weightgraft.engine.source_map import SlotName, SourceMap
from weightgraft.errors import GraftArgumentError

__all__ = ["Cell", "ScoredExample", "contrast_tokens", "exact_effects", "exact_effects_in", "example_cells", "group_cells", "cell_name",
           "parse_cell_name", "has_rest", "WHOLE", "REST"]

OUTPUT_ONLY = ("final_norm", "unembed")
WHOLE, REST = -1, -2  # ``Cell.unit``: the whole slot; a split slot's part in no unit (o/down bias)
Sharing = bool | Literal["depth", "prefix"]  # ``exact_effects``' path: True is "depth"; False, whole rows


@dataclass(frozen=True)
class Cell:
    """One slot at one position; with ``unit >= 0`` one head (q/k/v/o) or neuron (gate/up/down)
    of it, with ``unit == REST`` the slot's part that belongs to no unit."""

    position: int
    slot: int  # index into ``slots(model)``
    unit: int = WHOLE


def cell_name(slot_name: str, unit: int = WHOLE) -> str:
    """``layers.3.o`` (whole), ``layers.3.o/h2`` (head 2), ``layers.3.up/n17`` (neuron 17),
    ``layers.3.down/bias`` (the rest of a split down)."""
    if unit == WHOLE:
        return slot_name
    if unit == REST:
        return f"{slot_name}/bias"
    component = SlotName.parse(slot_name).component
    return f"{slot_name}/{'e' if component == 'experts' else 'n' if component in NEURON_COMPONENTS else 'h'}{unit}"


def parse_cell_name(name: str) -> tuple[str, int]:
    """The inverse of ``cell_name``: ``(slot name, unit)``."""
    slot_name, _, unit = name.partition("/")
    if not unit:
        return slot_name, WHOLE
    if unit == "bias":
        return slot_name, REST
    if unit[0] in "hne" and unit[1:].isdigit():
        return slot_name, int(unit[1:])
    raise GraftArgumentError(f"not a cell name: {name!r} (e.g. layers.3.o, layers.3.o/h2, layers.3.up/n17, layers.3.experts/e5, layers.3.down/bias)")


def has_rest(model: nn.Module, slot: Slot) -> bool:
    """Whether a split slot keeps a part of its own: o's or down's bias (input-side units)."""
    kind = slot.unit_kind()
    if kind is None or slot.unit_side(kind) != "in":
        return False
    return getattr(lora.base_layer(model.get_submodule(slot.parts[0].path)), "bias", None) is not None


@dataclass(frozen=True)
class ScoredExample:
    """A prompt scored at one position: the metric is read from the logits there."""

    input_ids: tuple[int, ...]
    position: int  # the scored position (usually the last prompt token)
    target: int
    distractor: int | None = None
    # the first tokens of the world's other answers (of the same field), ``fact_logprob``'s contrast
    other_answers: tuple[int, ...] = ()


def contrast_tokens(examples: Sequence[ScoredExample], metric: Metric) -> torch.Tensor | None:
    """What ``metric`` contrasts each example's answer with (``Batch.distractors``): its
    distractor ``[n]``, the world's other answers ``[n, k]`` padded with -1, or None; a one-line
    refusal where an example lacks what the metric needs."""
    spec = localize_metric(metric)
    if spec.needs_distractor:
        if any(ex.distractor is None for ex in examples):
            raise GraftArgumentError(f"metric {spec.name!r} needs a distractor on every example")
        return torch.tensor([ex.distractor for ex in examples])
    if spec.needs_answers:
        if any(not ex.other_answers for ex in examples):
            raise GraftArgumentError(f"metric {spec.name!r} needs other answers of the same field on every example "
                                     "(a world of one answer has no fact to tell apart)")
        k = max(len(ex.other_answers) for ex in examples)
        out = torch.full((len(examples), k), -1, dtype=torch.long)
        for i, ex in enumerate(examples):
            out[i, : len(ex.other_answers)] = torch.tensor(ex.other_answers)
        return out
    return None


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
        slot = SlotName.parse(model_slots(model)[c.slot].name)
        if slot.layer is not None:
            if slot.layer in wanted_layers and slot.component in wanted:
                chosen.append(c)
        elif slot.component in wanted:
            chosen.append(c)
    return chosen


def _item(example: ScoredExample, cells: Sequence[Cell], slot_list: Sequence[Slot]) -> GraftItem:
    """The graft of ``cells``: whole cells and rests in ``source``, units in unit maps (a unit
    map row starts from the slot's whole cells, so a whole cell grafts every unit too, a rest
    none)."""
    n = example.position + 1
    # one byte per entry: a single-cell map of a prompt holds (tokens x slots)^2 of them, and the
    # passes widen each pass's rows to long (``prefix.segment``)
    source = torch.zeros(n, len(slot_list), dtype=torch.uint8)
    whole = torch.zeros_like(source)
    units: dict[int, list[Cell]] = {}
    for c in cells:
        if c.position >= n:
            raise GraftArgumentError(f"cell at position {c.position} is after the scored position {example.position}")
        if c.unit < 0:
            source[c.position, c.slot] = 1
        if c.unit == WHOLE:
            whole[c.position, c.slot] = 1
        if c.unit != WHOLE:
            units.setdefault(c.slot, []).append(c)
    heads: dict[str, torch.Tensor] = {}
    neurons: dict[str, torch.Tensor] = {}
    for s, chosen in units.items():
        slot = slot_list[s]
        kind = slot.unit_kind()
        if kind is None and not slot.experts:
            raise GraftArgumentError(f"slot {slot.name} has no heads, neurons or experts; unit cells name q/k/v/o, "
                                     "gate/up/down or an expert bank")
        width, what = (slot.experts, "expert") if slot.experts else (slot.units(kind), str(kind))  # type: ignore[arg-type]
        maps = whole[:, s, None].repeat(1, width)
        for c in chosen:
            if c.unit == REST:
                continue
            if not 0 <= c.unit < width:
                raise GraftArgumentError(f"{slot.name} has {width} {what}s; no {what} {c.unit}")
            maps[c.position, c.unit] = 1
        # an expert map rides with the heads (the engine's route_unit_maps sorts it by the slot table)
        (heads if kind == Units.HEAD or slot.experts else neurons)[slot.name] = maps
    return GraftItem(example.input_ids[:n], SourceMap(source, heads, neurons), logit_start=example.position)


def _suffix(item: GraftItem) -> int:
    """Positions an item recomputes: from its first grafted position to its scored one."""
    grafted = item.maps.slots.any(dim=1)
    for maps in item.unit_maps().values():
        grafted = grafted | maps.any(dim=1)
    first = int(grafted.nonzero()[0]) if bool(grafted.any()) else item.logit_start
    return item.logit_start - first


def _unit_cost(item: GraftItem) -> tuple[tuple[str, ...], int]:
    """The slots an item maps unit by unit, and their total width."""
    maps = item.unit_maps()
    return tuple(sorted(maps)), sum(int(m.shape[1]) for m in maps.values())


def _suffix_batches(items: Sequence[GraftItem], order: Sequence[int], chunk: int, budget: int = UNIT_BUDGET) -> list[list[int]]:
    """``order`` cut into passes of at most ``chunk`` items whose padded unit maps (every item
    holds a map for every slot some item of its pass maps) stay within ``budget`` entries."""
    out: list[list[int]] = []
    current: list[int] = []
    widths: dict[str, int] = {}
    longest = 0
    for i in order:
        item_widths = {n: int(m.shape[1]) for n, m in items[i].unit_maps().items()}
        grown = {**widths, **item_widths}
        cost = (len(current) + 1) * max(longest, len(items[i])) * sum(grown.values())
        if current and (len(current) >= chunk or cost > budget):
            out.append(current)
            current, widths, longest = [], {}, 0
            grown = dict(item_widths)
        current.append(i)
        widths, longest = grown, max(longest, len(items[i]))
    if current:
        out.append(current)
    return out


def _prefix_logits(
    models: Sequence[nn.Module], items: Sequence[GraftItem], pad_id: int, chunk: int, share: bool,
    reduce: Reduce,
) -> torch.Tensor:
    """The prefix-only path (or whole rows, ``share=False``): items in batches of similar
    suffixes (a batch's suffixes are padded to its longest); items that map the same slots
    unit by unit go together (their maps pad to fewer slots). Each batch's logits are
    ``reduce``d before the next runs."""
    order = sorted(range(len(items)), key=lambda i: (_suffix(items[i]), _unit_cost(items[i]), i))
    out = None
    for rows in _suffix_batches(items, order, chunk):
        part = reduce(prefix_forward(models, [items[i] for i in rows], pad_id, share=share), rows)
        if out is None:
            out = part.new_empty(len(items), *part.shape[1:])
        out[torch.tensor(rows, device=out.device)] = part
    assert out is not None  # items is never empty
    return out


def _run(models: Sequence[nn.Module], items: Sequence[GraftItem], pad_id: int, chunk: int, share: Sharing,
         stats: DepthStats | None, references: Sequence[GraftItem], reduce: Reduce) -> torch.Tensor:
    if share is True or share == "depth":
        return depth_forward(models, items, pad_id, chunk=chunk, stats=stats, references=references, reduce=reduce)
    return _prefix_logits(models, items, pad_id, chunk, share == "prefix", reduce)


def exact_effects(
    models: Sequence[nn.Module], examples: Sequence[ScoredExample],
    cell_sets: Sequence[Sequence[Sequence[Cell]]], *, pad_id: int, metric: Metric = "first_logprob",
    chunk: int = 512, share: Sharing = True, stats: DepthStats | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(base metric [n_examples], [effects [len(cell_sets[i])] per example])``: the effect of
    grafting each set of cells of ``cell_sets[i]`` from ``models[1]`` into ``models[0]`` in
    example i, ``M(graft) - M(base)`` of ``metric`` (``engine.metric_table``; ``neg_kl_donor`` is
    measured against the donor's distribution).

    ``share``: ``True`` / ``"depth"`` runs each set from its first position and first layer
    (``weightgraft.engine.sharing.depth``), ``"prefix"`` from its first position through every layer
    (``weightgraft.engine.sharing.prefix``), ``False`` every row whole; all three give the same numbers.
    Each pass's logits become metric values before the next pass runs, so a call holds one
    pass's logits, not every set's. ``stats`` records what depth sharing held and ran."""
    base, effects = exact_effects_in(models, examples, cell_sets, pad_id=pad_id, metrics=(metric,), chunk=chunk,
                                     share=share, stats=stats)
    return base[:, 0], [e[:, 0] for e in effects]


@torch.no_grad()
def exact_effects_in(
    models: Sequence[nn.Module], examples: Sequence[ScoredExample],
    cell_sets: Sequence[Sequence[Sequence[Cell]]], *, pad_id: int, metrics: Sequence[Metric],
    chunk: int = 512, share: Sharing = True, stats: DepthStats | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """:func:`exact_effects` in several metrics read off the same passes: ``(base [n_examples,
    n_metrics], [effects [len(cell_sets[i]), n_metrics] per example])`` (a claim's fact effect
    and its plain effect cost one set of passes, not two)."""
    if len(models) != 2:
        raise GraftArgumentError("exact cell effects need exactly two models: [base, donor]")
    if len(cell_sets) != len(examples):
        raise GraftArgumentError("give one list of cell sets per example")
    if not metrics:
        raise GraftArgumentError("give at least one metric")
    contrasts = [contrast_tokens(examples, m) for m in metrics]
    slot_list = model_slots(models[0])
    items: list[GraftItem] = []
    owner: list[int] = []
    for i, (ex, sets) in enumerate(zip(examples, cell_sets)):
        items.append(_item(ex, [], slot_list))  # the base itself
        owner.append(i)
        for cells in sets:
            items.append(_item(ex, cells, slot_list))
            owner.append(i)
    # Each example's sets together are a row that sets of one family (a set without one of
    # its cells, in refinement) share more of than they share with the base.
    unions = [_item(ex, list(dict.fromkeys(c for cells in sets for c in cells)), slot_list)
              for ex, sets in zip(examples, cell_sets) if len(sets) > 1]
    reference = None
    if any(localize_metric(m).needs_donor for m in metrics):  # the donor's next-token distribution of each example, first
        donors = []
        for ex in examples:
            base = _item(ex, [], slot_list)
            whole = SourceMap(torch.ones_like(base.maps.slots))
            donors.append(GraftItem(base.input_ids, whole, logit_start=ex.position))
        logits = _run(models, donors, pad_id, chunk, share, None, (), lambda part, _rows: part[:, 0].double().cpu())
        reference = torch.log_softmax(logits, -1)
    owners = torch.tensor(owner)
    targets = torch.tensor([ex.target for ex in examples])[owners]
    per_row = [None if c is None else c[owners] for c in contrasts]

    def reduce(part: torch.Tensor, rows: list[int]) -> torch.Tensor:
        at = torch.as_tensor(rows, dtype=torch.long)
        logits = part[:, 0].double().cpu()
        return torch.stack([metric_values(logits, targets[at], m, None if c is None else c[at],
                                          None if reference is None else reference[owners[at]])
                            for m, c in zip(metrics, per_row)], dim=1)

    values = _run(models, items, pad_id, chunk, share, stats, unions, reduce)
    base_values, effects, row = [], [], 0
    for sets in cell_sets:
        base_values.append(values[row])
        effects.append(values[row + 1 : row + 1 + len(sets)] - values[row])
        row += 1 + len(sets)
    return torch.stack(base_values), effects
