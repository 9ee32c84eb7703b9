"""The batched grafting forward pass.

One forward pass of the base model in which every grafted module computes each (row,
position) with the module of the model that serves it: rows are split by source model (and
fused projections by output columns), each group runs through its own model's module, and
the outputs are put back in place. Keys and values at position t are thus computed with the
weights chosen for t, exactly as in the per-token KV-cache definition
(``weightgraft.engine.reference``), for a whole batch at once, and every row is computed once, by the
model that serves it (not by the base and then again by the donor).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, TypeVar

import torch
from torch import nn
from transformers.cache_utils import Cache

from weightgraft.engine import attention, blocks, mixers, moe, projections
from weightgraft.engine.architectures import Slot, model_slots
from weightgraft.engine.architectures.vision_language import refuse_media
from weightgraft.engine.compat import check_compatible
from weightgraft.engine.precision import one_cpu_path
from weightgraft.engine.source_map import SourceMap, merge_identical, position_ids_from_mask
from weightgraft.engine.swaps import Swaps, own_forward, swaps
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError

__all__ = ["slots", "graft_forward", "graft_call", "position_ids_from_mask"]


def slots(model: nn.Module) -> list[str]:
    """The graftable slots of ``model``: ``embed``, ``pos_embed`` (GPT-2's learned positions),
    ``layers.{i}.{component}``, ``final_norm``, ``unembed``, in that fixed order (the last axis of a ``source`` tensor)."""
    return [s.name for s in model_slots(model)]


@dataclass
class _Group:
    """One slot's share of a module: its output columns and its ``[batch, rows]`` model map;
    a slot grafted unit by unit (heads of q/k/v, neurons of gate/up) is one group with
    ``columns [units, width]`` and ``models [batch, rows, units]``."""

    columns: torch.Tensor | slice | None
    models: torch.Tensor

    def bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the smallest and largest model index serving the group."""
        if self.models.dim() == 2:
            return self.models, self.models
        return self.models.amin(-1), self.models.amax(-1)


def _as_index(columns: torch.Tensor | None) -> torch.Tensor | slice | None:
    """A contiguous column set becomes a slice, so weights are viewed, not copied."""
    if columns is None:
        return None
    start, n = int(columns[0]), columns.numel()
    if torch.equal(columns, torch.arange(start, start + n)):
        return slice(start, start + n)
    return columns


def _callers(targets: list[nn.Module]) -> list[Callable[..., Any]]:
    """Per model, what computes its rows: the base module's own (about to be swapped) forward."""
    return [own_forward(t) if i == 0 else t for i, t in enumerate(targets)]


_Rows = TypeVar("_Rows")


@dataclass
class _OnDevice(Generic[_Rows]):
    """Index tensors moved once to each device a module runs on (``device_map`` spreads layers)."""

    by_device: dict[torch.device, _Rows]

    def get(self, device: torch.device) -> _Rows:
        found = self.by_device.get(device)
        if found is None:
            first: Any = next(iter(self.by_device.values()))
            found = self.by_device[device] = replace(first, **{f.name: _move(getattr(first, f.name), device)
                                                                for f in fields(first)})
        return found


def _move(value: object, device: torch.device) -> object:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device) for v in value)
    if isinstance(value, _Group):
        columns = value.columns.to(device) if isinstance(value.columns, torch.Tensor) else value.columns
        return _Group(columns, value.models.to(device))
    return value


_RowSet = tuple[int, torch.Tensor, torch.Tensor]  # (model, rows b, rows t)
_Split = tuple[int | None, list[_RowSet], tuple[torch.Tensor, ...]]


@dataclass
class _DispatchRows:  # what a dispatching forward reads per call

    row_sets: list[_RowSet]
    mixed: tuple[torch.Tensor, ...]
    groups: list[_Group]


@dataclass
class _InUnitRows:  # what an input-side unit forward reads per call: mixed rows with their unit and bias models

    row_sets: list[_RowSet]
    b_mix: torch.Tensor
    t_mix: torch.Tensor
    mix_units: torch.Tensor
    mix_bias: torch.Tensor


def _rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(b, t)`` indices where a ``[batch, rows]`` mask holds."""
    b, t = mask.nonzero(as_tuple=True)
    return b, t


class _Lookup:
    """Per call: module by path in each model, and the row split of each distinct model map
    (most grafted modules share a few maps, e.g. every slot of a layer in a position scheme),
    so that planning costs per distinct map, not per module."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self.modules = [dict(m.named_modules(remove_duplicate=False)) for m in models]
        self.splits: dict[tuple[bytes, ...], _Split] = {}

    def targets(self, path: str) -> list[nn.Module]:
        return [named[path] for named in self.modules]

    def split(self, groups: list[_Group]) -> _Split:
        """``(single model or None, [(model, rows b, rows t)], mixed rows)`` for ``groups``."""
        key = tuple(g.models.cpu().numpy().tobytes() for g in groups)
        if key not in self.splits:
            stacked = torch.stack([b for g in groups for b in g.bounds()], dim=-1)  # [batch, rows, 2 groups]
            uniform = (stacked == stacked[..., :1]).all(dim=-1)
            whole = stacked[..., 0]
            present = torch.unique(whole).tolist()
            single = present[0] if len(present) == 1 and bool(uniform.all()) else None
            row_sets = [(m, *_rows((whole == m).logical_and(uniform))) for m in present]
            self.splits[key] = (single, row_sets, (~uniform).nonzero(as_tuple=True))
        return self.splits[key]


def _dispatch_forward(path: str, lookup: _Lookup, groups: list[_Group], pos_axis: int) -> Callable[..., torch.Tensor]:
    """A forward for the base module at ``path`` that computes every row once, with the
    weights of the model that serves it (rows split by model; fused modules by columns)."""
    targets = lookup.targets(path)
    fns = _callers(targets)
    single, row_sets, mixed = lookup.split(groups)

    placed = _OnDevice({groups[0].models.device: _DispatchRows(row_sets, mixed, groups)})

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if single is not None:
            whole: torch.Tensor = fns[single](x, *args, **kwargs)
            return whole
        here = placed.get(x.device)
        mixed, groups = here.mixed, here.groups
        xv = moe.by_position(x, pos_axis, groups[0].models.shape[:2])
        out: torch.Tensor | None = None
        for m, b, t in here.row_sets:
            if b.numel() == 0:
                continue
            y = fns[m](xv[b, t], *args, **kwargs)
            if out is None:
                out = y.new_empty(*xv.shape[:2], *y.shape[1:])
            out[b, t] = y
        if mixed[0].numel():
            b_mix, t_mix = mixed
            x_mix = xv[b_mix, t_mix]
            chosen = _column_models(groups, b_mix, t_mix, projections.out_features(targets[0]))  # [rows, out]
            y_mix: torch.Tensor | None = None
            for m in torch.unique(chosen).tolist():
                sel = (chosen == m).any(dim=1).nonzero().flatten()
                y = fns[m](x_mix[sel], *args, **kwargs)  # every column of model m, kept where m serves
                if y_mix is None:
                    y_mix = y.new_zeros(len(b_mix), y.shape[-1])
                y_mix[sel] = torch.where(chosen[sel] == m, y, y_mix[sel])
            assert y_mix is not None  # mixed rows have some model
            if out is None:
                out = y_mix.new_empty(*xv.shape[:2], y_mix.shape[-1])
            out[b_mix, t_mix] = y_mix
        assert out is not None  # every row is in a row set or mixed
        return moe.from_positions(out, pos_axis)

    return forward


def _column_models(groups: list[_Group], b: torch.Tensor, t: torch.Tensor, width: int) -> torch.Tensor:
    """``[len(b), width]``: the model serving each output column of rows ``(b, t)``."""
    out = torch.full((len(b), width), -1, dtype=torch.long, device=b.device)
    for g in groups:
        chosen = g.models[b, t]
        if g.columns is None:
            out[:] = chosen[:, None]
        elif isinstance(g.columns, torch.Tensor) and g.columns.dim() == 2:  # units: [units, w]
            out[:, g.columns.reshape(-1)] = chosen.repeat_interleave(g.columns.shape[1], dim=1)
        else:
            out[:, g.columns] = chosen[:, None]
    if bool((out < 0).any()):
        raise RuntimeError("a grafted module has output columns that no slot owns")
    return out


def _in_unit_forward(
    path: str, lookup: _Lookup, unit_models: torch.Tensor, bias_models: torch.Tensor,
    unit_width: int, pos_axis: int,
) -> Callable[..., torch.Tensor]:
    """A forward for a projection grafted unit by unit on its input side (o by head, down by
    neuron): its input columns (one group of ``unit_width`` per unit) are multiplied by the
    weights of the model serving that unit and summed; the bias, which belongs to no unit,
    comes from ``bias_models``."""
    targets = lookup.targets(path)
    fns = _callers(targets)
    stacked = torch.cat([unit_models, bias_models[..., None]], dim=-1)  # [batch, rows, units+1]
    uniform = (stacked == stacked[..., :1]).all(dim=-1)
    whole = stacked[..., 0]
    row_sets = [(int(m), *_rows((whole == m).logical_and(uniform))) for m in torch.unique(whole)]
    b_mix, t_mix = (~uniform).nonzero(as_tuple=True)
    mix_units = unit_models[b_mix, t_mix]  # [n, units]
    mix_bias = bias_models[b_mix, t_mix]

    placed = _OnDevice({unit_models.device: _InUnitRows(row_sets, b_mix, t_mix, mix_units, mix_bias)})

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        here = placed.get(x.device)
        b_mix, t_mix, mix_units, mix_bias = here.b_mix, here.t_mix, here.mix_units, here.mix_bias
        xv = moe.by_position(x, pos_axis, unit_models.shape[:2])
        out: torch.Tensor | None = None
        for m, b, t in here.row_sets:
            if b.numel():
                y = fns[m](xv[b, t], *args, **kwargs)
                if out is None:
                    out = y.new_empty(*xv.shape[:2], *y.shape[1:])
                out[b, t] = y
        if b_mix.numel():
            x_mix = xv[b_mix, t_mix]
            y = None
            for m in torch.unique(mix_units).tolist():
                keep = (mix_units == m).repeat_interleave(unit_width, dim=1).to(x_mix.dtype)
                part = _matmul_no_bias(targets[m], x_mix * keep)
                y = part if y is None else y + part
            for m in torch.unique(mix_bias).tolist():
                bias = targets[m].bias
                if bias is not None:
                    rows = mix_bias == m
                    y[rows] = y[rows] + bias
            if out is None:
                out = y.new_empty(*xv.shape[:2], y.shape[-1])
            out[b_mix, t_mix] = y
        assert out is not None  # every row is in a row set or mixed
        return moe.from_positions(out, pos_axis)

    return forward


def _matmul_no_bias(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    try:
        return projections.matmul_no_bias(module, x)
    except projections.UnsupportedProjection as exc:
        raise GraftArgumentTypeError(f"per-head or per-neuron grafting on {exc}") from exc


def _plan(base: nn.Module, slot_list: list[Slot], columns: list[torch.Tensor], units: dict[int, torch.Tensor],
          donors: list[bool]) -> dict[str, tuple[list[_Group], int]]:
    """Per base module that some slot grafts (``donors[s]``: a donor serves slot s somewhere): the
    column groups of its slots (one unit group for q/k/v by head, gate/up by neuron: ``units``)."""
    by_module: dict[str, tuple[list[_Group], int]] = {}
    grafted_paths = {
        part.path for s in range(len(columns))
        if donors[s] or (s in units and bool((units[s] != 0).any()))
        for part in slot_list[s].parts
    }
    for s, slot in enumerate(slot_list):
        for part in slot.parts:
            if part.path not in grafted_paths:
                continue
            groups, _ = by_module.setdefault(part.path, ([], part.pos_axis))
            if s in units:
                kind = slot.unit_kind()
                assert kind is not None  # SourceMap.checked took unit maps of unit slots only
                unit_cols = slot.unit_columns(base.get_submodule(part.path), kind)
                groups.append(_Group(torch.stack(unit_cols).to(columns[s].device), units[s]))
                continue
            cols = _as_index(part.columns)
            if isinstance(cols, torch.Tensor):
                cols = cols.to(columns[s].device)
            groups.append(_Group(cols, columns[s]))
    return by_module


def graft_forward(
    models: Sequence[nn.Module],
    input_ids: torch.Tensor,
    source: torch.Tensor | SourceMap,
    *,
    attention_mask: torch.Tensor | None = None,
    logit_positions: torch.Tensor | None = None,
    head_source: Mapping[str, torch.Tensor] | None = None,
    past_key_values: Cache | None = None,
    neuron_source: Mapping[str, torch.Tensor] | None = None,
    expert_source: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]`` of the grafted pass (:func:`graft_call`). The public edge: ``source``
    and the loose unit maps ``head_source``, ``neuron_source``, ``expert_source`` (slot name ->
    ``[batch, seq, units]``) become one :class:`SourceMap` here, so the engine has one input."""
    maps = SourceMap.of(source, heads=head_source, neurons=neuron_source, experts=expert_source)
    logits: torch.Tensor = graft_call(models, input_ids, maps, attention_mask=attention_mask,
                                      logit_positions=logit_positions, past_key_values=past_key_values).logits
    return logits


def graft_call(
    models: Sequence[nn.Module],
    input_ids: torch.Tensor,
    source: SourceMap,
    *,
    attention_mask: torch.Tensor | None = None,
    logit_positions: torch.Tensor | None = None,
    past_key_values: Cache | None = None,
    use_cache: bool | None = None,
) -> Any:
    """The base model's output (``.logits`` ``[batch, seq, vocab]``, ``.past_key_values``) of
    one batched forward pass in which slot ``s`` at position ``t`` of row ``b`` uses the
    weights of ``models[source.slots[b, t, s]]``, and each unit map of ``source`` (heads,
    neurons, experts: :class:`SourceMap` says how each grafts) overrides its slot unit by unit.

    ``models[0]`` is the base; all models must share architecture and shapes. Padding (left
    or right) is handled through ``attention_mask``. With ``logit_positions`` (``[batch, k]``
    position indices) only those logits are computed and ``[batch, k, vocab]`` is returned:
    the unembedding, usually the largest matrix, then runs on k rows instead of seq.

    ``past_key_values`` (a ``transformers.DynamicCache``) continues rows whose earlier
    positions an earlier call computed (prefix sharing, ``weightgraft.engine.sharing.prefix``): the cache is
    filled or extended in place, ``source`` covers only the new positions, and
    ``attention_mask`` covers cached and new ones (``[batch, cached + seq]``), so that
    positions continue from the cached ones.
    """
    base, slot_list = _base_of(models)
    inputs = _inputs(base, input_ids, attention_mask, past_key_values)
    batch, seq = inputs.input_ids.shape
    device = inputs.input_ids.device
    maps = source.checked(slot_list, batch, seq, n_models=len(models), device=device)
    models, slot_map, units = merge_identical(models, maps.slots, maps.units)
    banks = {s: units.pop(s) for s in list(units) if slot_list[s].experts}  # expert by expert
    columns = [slot_map[:, :, s] for s in range(len(slot_list))]
    with swaps() as swap:
        if logit_positions is not None:  # "unembed" is always the last slot
            logit_positions = swap.logit_rows(base.get_submodule(slot_list[-1].parts[0].path),
                                              logit_positions.to(device), (batch, seq))
            columns[-1] = columns[-1].gather(1, logit_positions)
        padded = bool(inputs.attention_mask[:, inputs.cached:].eq(0).any())
        _swap_grafted(swap, base, slot_list, _Lookup(models), slot_map, columns, units, banks, padded=padded)
        swap.eval_mode(models)
        swap.eager_attention(models)
        return base(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None if use_cache is None else use_cache,
        )


def _base_of(models: Sequence[nn.Module]) -> tuple[nn.Module, list[Slot]]:
    """The base (``models[0]``) and its slot table, once the models are known to fit together."""
    if len(models) == 0:
        raise GraftArgumentError("graft_forward needs at least one model (the base)")
    check_compatible(models)
    one_cpu_path(models)
    return models[0], model_slots(models[0])


@dataclass(frozen=True)
class _Inputs:
    """A pass's token inputs on the base's device (the mask covers cached and new positions)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    cached: int


def _inputs(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
            past_key_values: Cache | None) -> _Inputs:
    """The pass's token inputs checked and placed where the source map lives (the embedding's device)."""
    if input_ids.dim() != 2:
        raise GraftArgumentError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
    refuse_media(base, input_ids, attention_mask)
    batch, seq = input_ids.shape
    device = projections.input_embedding_weight(base).device
    cached = past_key_values.get_seq_length() if past_key_values is not None else 0
    if attention_mask is None:
        attention_mask = torch.ones(batch, cached + seq, dtype=torch.long, device=device)
    attention_mask = attention_mask.to(device)
    if attention_mask.shape != (batch, cached + seq):
        raise GraftArgumentError(
            "attention_mask must have the shape of input_ids"
            + (f" plus the {cached} cached positions" if cached else "")
        )
    return _Inputs(input_ids.to(device), attention_mask, position_ids_from_mask(attention_mask)[:, cached:], cached)


def _swap_grafted(swap: Swaps, base: nn.Module, slot_list: list[Slot], lookup: _Lookup, slot_map: torch.Tensor,
                  columns: list[torch.Tensor], units: dict[int, torch.Tensor], banks: dict[int, torch.Tensor], *,
                  padded: bool) -> None:
    """Swap in a dispatching forward for every base module a donor serves: input-side unit grafts first,
    then layer kinds with a forward of their own (experts, sinks, mixers), then the rest by rows and columns."""
    swapped_in, out_units = _swap_in_units(swap, base, slot_list, lookup, columns, units)
    donors = slot_map.ne(0).flatten(0, 1).any(dim=0).tolist()  # one reduction, not one per slot
    donors[-1] = bool(columns[-1].ne(0).any())  # the unembedding at the logit rows only
    swapped_in |= moe.swap_banks(swap, lookup.targets, base, slot_list, columns, banks, donors)
    swapped_in |= attention.swap_sinks(swap, lookup.targets, base, slot_list, columns, donors)
    attention.swap_latent_caches(swap, base, slot_list)  # MLA: a cache holds keys decompressed at their positions
    swapped_in |= mixers.swap_mixers(swap, lookup.targets, base, slot_list, columns, donors, padded=padded)
    swapped_in |= blocks.swap_scalars(swap, lookup.targets, base, slot_list, columns, donors)
    for path, (groups, pos_axis) in _plan(base, slot_list, columns, out_units, donors).items():
        if path not in swapped_in:
            swap.forward(base.get_submodule(path), _dispatch_forward(path, lookup, groups, pos_axis))


def _swap_in_units(swap: Swaps, base: nn.Module, slot_list: list[Slot], lookup: _Lookup,
                   columns: list[torch.Tensor], units: dict[int, torch.Tensor]) -> tuple[set[str], dict[int, torch.Tensor]]:
    """Swap in the input-side unit grafts (o by head, down by neuron) where a unit's model differs
    from its slot's; returns the modules so swapped and the output-side unit maps, left to ``_plan``."""
    swapped_in: set[str] = set()
    out_units = {}
    for s, unit_models in units.items():
        slot = slot_list[s]
        kind = slot.unit_kind()
        assert kind is not None  # SourceMap.checked took unit maps of unit slots only
        if slot.unit_side(kind) == "out":
            out_units[s] = unit_models
        elif bool((unit_models != columns[s][..., None]).any()):  # else the slot's map serves
            (part,) = slot.parts
            module = base.get_submodule(part.path)
            width = len(slot.unit_columns(module, kind)[0])
            swap.forward(module, _in_unit_forward(part.path, lookup, unit_models, columns[s], width, part.pos_axis))
            swapped_in.add(part.path)
    return swapped_in, out_units
