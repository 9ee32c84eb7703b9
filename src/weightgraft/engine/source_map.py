"""What serves what in one grafted forward pass: the source map of whole slots, attention heads
and MLP neurons, validated against the model's slot table.

A :class:`SourceMap` travels as one object from where a batch is built (schemes, padding,
prefix and depth sharing) to :func:`weightgraft.engine.forward.graft_call`; which of its unit
maps are heads and which are neurons is read from the slot table, never from a slot's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from weightgraft.engine.architectures import Slot, UnitKind, Units
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError

__all__ = ["SourceMap", "check_units", "merge_identical", "model_indices", "position_ids_from_mask"]


@dataclass(frozen=True)
class SourceMap:
    """Which model serves each piece of a batch: ``slots[..., s]`` names the model of slot ``s``
    (``[batch, seq, n_slots]`` for a pass, ``[seq, n_slots]`` for one row); ``heads`` (slot name
    -> ``[..., heads]``) and ``neurons`` (slot name -> ``[..., neurons]``) override their slot
    unit by unit (``graft_call`` says how)."""

    slots: torch.Tensor
    heads: Mapping[str, torch.Tensor] = field(default_factory=dict)
    neurons: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = sorted(set(self.heads) & set(self.neurons))
        if both:
            raise GraftArgumentError(f"slot {both[0]!r} is mapped both head by head and neuron by neuron")

    @classmethod
    def from_units(cls, slots: torch.Tensor, units: Mapping[str, torch.Tensor],
                   slot_list: Sequence[Slot]) -> SourceMap:
        """Unit maps keyed by slot name, each a head or a neuron map as the slot table says."""
        kinds = {slot.name: slot.unit_kind() for slot in slot_list}
        unknown = sorted(set(units) - set(kinds))
        if unknown:
            raise GraftArgumentError(f"a unit map names {unknown[0]!r}, which is not a slot of this model")
        return cls(slots, {n: m for n, m in units.items() if kinds[n] == Units.HEAD},
                   {n: m for n, m in units.items() if kinds[n] != Units.HEAD})


def check_units(
    unit_source: Mapping[str, torch.Tensor], slot_list: list[Slot], batch: int, *, seq: int,
    n_models: int, device: torch.device, kind: UnitKind,
) -> dict[int, torch.Tensor]:
    """``head_source`` (``Units.HEAD``) or ``neuron_source`` (``Units.NEURON``) keyed by
    slot index, validated: slots with units of that kind only, right shapes."""
    arg, which = f"{kind}_source", "q, k, v and o" if kind == Units.HEAD else "gate, up and down"
    index = {slot.name: s for s, slot in enumerate(slot_list)}
    out: dict[int, torch.Tensor] = {}
    for name, tensor in unit_source.items():
        if name not in index:
            raise GraftArgumentError(f"{arg} names {name!r}, which is not a slot of this model")
        slot = slot_list[index[name]]
        n = slot.units(kind)
        if not n:
            per_unit = [s.name for s in slot_list if s.units(kind)][:4]
            raise GraftArgumentError(
                f"slot {name!r} cannot be grafted per {kind}; only {which} can "
                f"(e.g. {', '.join(per_unit)})"
            )
        if tuple(tensor.shape) != (batch, seq, n):
            raise GraftArgumentError(
                f"{arg}[{name!r}] must have shape [batch, seq, {kind}s] = "
                f"{[batch, seq, n]}, got {list(tensor.shape)}"
            )
        out[index[name]] = model_indices(f"{arg}[{name!r}]", tensor, n_models, device)
    return out


def model_indices(what: str, tensor: torch.Tensor, n_models: int, device: torch.device) -> torch.Tensor:
    """A unit map's model indices, checked (an integer tensor, each value a model) and on ``device``."""
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise GraftArgumentTypeError(f"{what} must be an integer tensor, got {tensor.dtype}")
    tensor = tensor.to(device=device, dtype=torch.long)
    if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= n_models):
        raise GraftArgumentError(f"{what} values must index the {n_models} models")
    return tensor


def merge_identical(
    models: Sequence[nn.Module], source: torch.Tensor, units: dict[int, torch.Tensor],
) -> tuple[list[nn.Module], torch.Tensor, dict[int, torch.Tensor]]:
    """One model object under several indices (``{"pre": pre, "sft": pre}``, the identity
    graft) is one model: its indices are merged, so no module is patched to call itself."""
    first: dict[int, int] = {}
    distinct: list[nn.Module] = []
    remap = []
    for m in models:
        if id(m) not in first:
            first[id(m)] = len(distinct)
            distinct.append(m)
        remap.append(first[id(m)])
    if len(distinct) == len(models):
        return list(models), source, units
    table = torch.tensor(remap, device=source.device)
    return distinct, table[source], {s: table[u] for s, u in units.items()}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore padding on either side (left padding needs this to be exact)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp_(min=0)
