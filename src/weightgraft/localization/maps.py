"""Cell maps of a list of examples as table rows: estimates (gradient, integrated gradients)
from partial grafts, exact effects from the engine.

Every row has a ``unit``: -1 (``WHOLE``) for a whole cell; with ``units: head`` / ``neuron`` the
split slots (q/k/v/o, gate/up/down) also get rows per head / neuron ``k >= 0`` and, where o or
down has a bias, a row ``-2`` (``REST``: the bias, which belongs to no unit). A split slot's
whole row is the sum of its unit rows and its rest; ``whole_cells`` keeps the map of cells.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from weightgraft.engine.architectures import Units, model_slots
from weightgraft.engine.attribution import Metric, graft_attribution, graft_unit_attribution
from weightgraft.engine.cells import (
    OUTPUT_ONLY,
    REST,
    WHOLE,
    Cell,
    contrast_tokens,
    exact_effects,
    example_cells,
    has_rest,
    parse_cell_name,
)
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.source_map import SlotName
from weightgraft.localization.examples import LocalizeExample

CELL_KEYS = ["example_id", "template", "direction", "position", "slot", "unit"]


def whole_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of whole cells (a run with ``units: cell``, or made before units, is all of them)."""
    return frame[frame["unit"] == WHOLE] if "unit" in frame else frame


def slot_parts(name: str) -> tuple[int | None, str]:
    """``layers.3.o`` -> (3, "o"); ``embed`` -> (None, "embed"); a unit cell's name
    (``layers.3.o/h2``) -> its slot's."""
    slot = SlotName.parse(parse_cell_name(name)[0])
    return slot.layer, slot.component


def _batch(examples: Sequence[LocalizeExample], metric: Metric):
    """Right-padded ids, mask, scored positions, targets and what ``metric`` contrasts the
    answer with (``engine.cells.contrast_tokens``) of one batch."""
    n = max(e.scored.position + 1 for e in examples)
    ids = torch.zeros(len(examples), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        row = e.scored.input_ids[: e.scored.position + 1]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    pos = torch.tensor([e.scored.position for e in examples])
    targets = torch.tensor([e.scored.target for e in examples])
    return ids, mask, pos, targets, contrast_tokens([e.scored for e in examples], metric)


def _cell_frame(examples: Sequence[LocalizeExample], direction: str, slot_names: Sequence[str],
                values: dict[str, list[torch.Tensor]], model) -> pd.DataFrame:
    """One row per cell of every example (the cells of ``example_cells``, in its order), with
    the given per-example ``[seq, n_slots]`` maps."""
    n_slots = len(slot_names)
    parts = [slot_parts(name) for name in slot_names]
    output_only = np.array([name in OUTPUT_ONLY for name in slot_names])
    columns: dict[str, list] = defaultdict(list)
    for i, e in enumerate(examples):
        n = e.scored.position + 1
        t = np.repeat(np.arange(n), n_slots)
        s = np.tile(np.arange(n_slots), n)
        keep = ~output_only[s] | (t == e.scored.position)
        t, s = t[keep], s[keep]
        columns["example_id"].append(np.full(len(t), e.prompt.id, dtype=object))
        columns["template"].append(np.full(len(t), e.prompt.template, dtype=object))
        columns["position"].append(t)
        columns["position_label"].append(np.asarray(e.labels, dtype=object)[t])
        columns["slot"].append(np.asarray(slot_names, dtype=object)[s])
        columns["layer"].append(np.array([parts[k][0] if parts[k][0] is not None else -1 for k in s]))
        columns["component"].append(np.asarray([p[1] for p in parts], dtype=object)[s])
        for col, maps in values.items():
            columns[col].append(maps[i][:n].double().numpy()[t, s])
    frame = pd.DataFrame({k: np.concatenate(v) for k, v in columns.items()})
    frame.insert(2, "direction", direction)
    frame["layer"] = frame["layer"].astype("Int64").mask(frame["layer"] < 0)
    frame["unit"] = WHOLE
    order = ["example_id", "template", "direction", "position", "position_label", "slot", "unit", "layer", "component"]
    return frame[order + list(values)]


def _unit_frame(examples: Sequence[LocalizeExample], direction: str, rows: list[list[tuple]],
                columns: Sequence[str]) -> pd.DataFrame:
    """Unit rows: per example ``(position, slot name, unit, *values)`` tuples."""
    records = []
    for e, chosen in zip(examples, rows):
        for t, name, unit, *values in chosen:
            layer, component = slot_parts(name)
            records.append((e.prompt.id, e.prompt.template, direction, t, e.labels[t], name, unit,
                            layer if layer is not None else -1, component, *values))
    order = ["example_id", "template", "direction", "position", "position_label", "slot", "unit", "layer", "component"]
    frame = pd.DataFrame.from_records(records, columns=order + list(columns))
    frame["layer"] = frame["layer"].astype("Int64").mask(frame["layer"] < 0)
    frame["position"] = frame["position"].astype("int64")
    frame["unit"] = frame["unit"].astype("int64")
    return frame


def _top_units(g: torch.Tensor, per_unit: dict[str, torch.Tensor], ig: tuple | None, *, names: Sequence[str],
               rests: set[str], n: int, keep: int) -> list[tuple]:
    """One example's unit rows: its ``keep`` units (and rests) of largest |gradient| over
    positions ``0..n-1``, as ``(position, slot, unit, estimate[, estimate_ig])``."""
    index = {name: s for s, name in enumerate(names)}
    blocks, labels = [], []
    for name, u in per_unit.items():
        blocks.append(u[:n])
        labels.append((name, u.shape[-1]))
        if name in rests:
            blocks.append(g[:n, index[name], None])
            labels.append((name, REST))
    flat = torch.cat(blocks, dim=-1).double()  # [n, all units]
    ig_flat = None
    if ig is not None:
        ig_g, ig_units = ig
        parts = []
        for name, width in labels:
            parts.append(ig_g[:n, index[name], None] if width == REST else ig_units[name][:n])
        ig_flat = torch.cat(parts, dim=-1).double()
    offsets, unit_of = [], []
    for name, width in labels:
        count = 1 if width == REST else width
        offsets.append(count)
        unit_of.append((name, width))
    starts = np.cumsum([0] + offsets)
    k = min(keep, flat.numel())
    top = flat.abs().reshape(-1).topk(k).indices
    out = []
    width_all = flat.shape[1]
    for i in top.tolist():
        t, col = divmod(i, width_all)
        j = int(np.searchsorted(starts, col, side="right") - 1)
        name, width = unit_of[j]
        unit = REST if width == REST else col - int(starts[j])
        row = (t, name, unit, float(flat[t, col]))
        out.append(row + ((float(ig_flat[t, col]),) if ig_flat is not None else ()))
    return out


def estimate_frame(
    pair: PartialGraft, examples: Sequence[LocalizeExample], direction: str, *, metric: Metric,
    batch_size: int, ig_steps: int = 0, units: Units = Units.CELL, unit_rows: int = 20000,
) -> pd.DataFrame:
    """Gradient estimates (and integrated gradients with ``ig_steps > 1``) of every cell.
    Batches hold examples of one length where possible (sorted by length: little padding).
    With ``units`` ``head`` / ``neuron``, every unit is estimated in the same backward pass;
    whole-cell rows of split slots are the sums of their units and rest, and per example the
    ``unit_rows`` unit rows of largest |gradient| are kept (a neuron map of every unit of 80
    prompts would be hundreds of millions of rows)."""

    names = [s.name for s in pair.slots]
    rests = {s.name for s in pair.slots if s.units(units) and has_rest(pair.base, s)}
    order = sorted(range(len(examples)), key=lambda i: (examples[i].scored.position, i))
    grads: dict[int, torch.Tensor] = {}
    igs: dict[int, torch.Tensor] = {}
    unit_rows_of: dict[int, list[tuple]] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        ids, mask, pos, targets, distractors = _batch([examples[i] for i in chunk], metric)
        if units == Units.CELL:
            g = graft_attribution(pair, ids, pos, targets=targets, metric=metric, distractors=distractors, attention_mask=mask)
            ig = (graft_attribution(pair, ids, pos, targets=targets, metric=metric, distractors=distractors, attention_mask=mask, steps=ig_steps)
                  if ig_steps > 1 else None)
        else:
            g, per_unit = graft_unit_attribution(pair, ids, pos, targets=targets, kind=units, metric=metric, distractors=distractors, attention_mask=mask)
            ig_pair = (graft_unit_attribution(pair, ids, pos, targets=targets, kind=units, metric=metric, distractors=distractors, attention_mask=mask, steps=ig_steps)
                       if ig_steps > 1 else None)
            for j, i in enumerate(chunk):
                n = examples[i].scored.position + 1
                ig_j = (ig_pair[0][j], {k: v[j] for k, v in ig_pair[1].items()}) if ig_pair else None
                unit_rows_of[i] = _top_units(g[j], {k: v[j] for k, v in per_unit.items()}, ig_j, names=names, rests=rests, n=n, keep=unit_rows)
            g = _summed(g, per_unit, names)  # whole cells: units plus rest
            ig = _summed(*ig_pair, names) if ig_pair else None
        for j, i in enumerate(chunk):
            grads[i] = g[j].float()
            if ig is not None:
                igs[i] = ig[j].float()
    values = {"estimate": [grads[i] for i in range(len(examples))]}
    if igs:
        values["estimate_ig"] = [igs[i] for i in range(len(examples))]
    frame = _cell_frame(examples, direction, names, values, pair.base)
    if units == Units.CELL:
        return frame
    unit_frame = _unit_frame(examples, direction, [unit_rows_of[i] for i in range(len(examples))], list(values))
    return pd.concat([frame, unit_frame], ignore_index=True)


def blank_frame(model: torch.nn.Module, examples: Sequence[LocalizeExample], direction: str) -> pd.DataFrame:
    """``estimate_frame``'s rows and columns of whole cells with every ``estimate`` NaN: the cells of
    a run without gradient estimates (``estimates: false``), which the exact maps fill and the
    claims read (their keys; ``share_estimate`` is then NaN)."""
    names = [s.name for s in model_slots(model)]
    maps = [torch.full((e.scored.position + 1, len(names)), float("nan"), dtype=torch.float64) for e in examples]
    return _cell_frame(examples, direction, names, {"estimate": maps}, model)


def _summed(g: torch.Tensor, per_unit: dict[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """Cell estimates with each split slot's units added to its rest (its whole cell)."""
    g = g.clone()
    for name, u in per_unit.items():
        g[..., names.index(name)] += u.sum(-1)
    return g


def exact_frame(
    models: Sequence[torch.nn.Module], examples: Sequence[LocalizeExample], direction: str,
    *, metric: Metric, pad_id: int, chunk: int = 512, unit_cells: Sequence[Sequence[Cell]] | None = None,
) -> tuple[pd.DataFrame, list[float]]:
    """Exact single-cell effects of every cell (and of ``unit_cells[i]``, example i's unit
    cells), and each example's base metric."""

    names = [s.name for s in model_slots(models[0])]
    extra = [list(u) for u in unit_cells] if unit_cells is not None else [[] for _ in examples]
    cells = [example_cells(models[0], e.scored) for e in examples]
    base, effects = exact_effects(models, [e.scored for e in examples],
                                  [[[c] for c in cs + us] for cs, us in zip(cells, extra)], pad_id=pad_id, metric=metric, chunk=chunk)
    maps, unit_rows = [], []
    for e, cs, us, eff in zip(examples, cells, extra, effects):
        m = torch.full((e.scored.position + 1, len(names)), float("nan"))
        values = eff.tolist()
        for c, v in zip(cs, values):
            m[c.position, c.slot] = v
        maps.append(m)
        unit_rows.append([(c.position, names[c.slot], c.unit, v) for c, v in zip(us, values[len(cs):])])
    frame = _cell_frame(examples, direction, names, {"exact": maps}, models[0])
    if unit_cells is not None:
        frame = pd.concat([frame, _unit_frame(examples, direction, unit_rows, ["exact"])], ignore_index=True)
    return frame, base.tolist()


def cell_map(example: LocalizeExample, slot_index: dict[str, int], model) -> dict[tuple[str, str], Cell]:
    """(position label, slot name) -> the example's cell."""
    names = {v: k for k, v in slot_index.items()}
    return {(example.labels[c.position], names[c.slot]): c for c in example_cells(model, example.scored)}


def unit_picks(estimates: pd.DataFrame, examples: Sequence[LocalizeExample], model, units: Units,
               n: int):
    """``example -> its n unit cells of largest |estimate|`` (the exact unit map's cells; the
    whole cells are all mapped exactly anyway)."""

    index = {s.name: i for i, s in enumerate(model_slots(model))}
    rows = estimates[estimates["unit"] != WHOLE]
    by_example = {k: g for k, g in rows.groupby(["template", "example_id"], sort=False)}

    def pick(example: LocalizeExample) -> list[Cell]:
        group = by_example.get((example.prompt.template, example.prompt.id))
        if group is None or n == 0:
            return []
        top = group.loc[group["estimate"].abs().nlargest(n).index]
        return [Cell(int(t), index[s], int(u)) for t, s, u in zip(top["position"], top["slot"], top["unit"])]

    return pick


class UnitCellMap(Mapping):
    """One example's cells by key ``(position label, cell name)`` (``cell_name``: a slot, a
    head ``layers.3.o/h2``, a neuron ``layers.3.up/n17`` or a rest ``layers.3.down/bias``),
    resolved on lookup (a neuron model has millions); iterating gives the ``universe`` keys
    (the keys that have estimates) this example has."""

    def __init__(self, example: LocalizeExample, slot_index: dict[str, int], model, universe: Sequence) -> None:

        self.whole = cell_map(example, slot_index, model)
        self.positions = {label: t for t, label in enumerate(example.labels)}
        slot_list = model_slots(model)
        self.split = {s.name: (i, s.units(s.unit_kind()), has_rest(model, s))
                      for i, s in enumerate(slot_list) if s.unit_kind() is not None}
        self.universe = universe

    def __getitem__(self, key) -> Cell:

        label, name = key
        if "/" not in name:
            return self.whole[key]
        slot, unit = parse_cell_name(name)
        if slot not in self.split or label not in self.positions:
            raise KeyError(key)
        s, n, rest = self.split[slot]
        if not (0 <= unit < n or (unit == REST and rest)):
            raise KeyError(key)
        return Cell(self.positions[label], s, unit)

    def __iter__(self):
        return (k for k in self.universe if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
