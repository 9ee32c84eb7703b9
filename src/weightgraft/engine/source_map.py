"""What serves what in one grafted forward pass: the source map of whole slots, attention heads,
MLP neurons and experts, validated against the model's slot table.

A :class:`SourceMap` travels as one object from where a batch is built (schemes, padding,
prefix and depth sharing) to :func:`weightgraft.engine.forward.graft_call`, the engine's one
input; which of its unit maps are heads, neurons or experts is read from the slot table, never
from a slot's name, and every check of a map against a model and a batch is
:meth:`SourceMap.checked` (the public ``graft_forward`` builds one with :meth:`SourceMap.of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from weightgraft.engine.architectures import Slot, UnitKind, Units
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError

__all__ = ["CheckedMap", "SlotName", "SourceMap", "merge_identical", "position_ids_from_mask"]

UnitMaps = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class SlotName:
    """A slot's name read once, a source map's key as parts: ``layers.3.o`` is layer 3's ``o``;
    ``embed``, ``pos_embed``, ``final_norm`` and ``unembed`` have no layer. The one parser of
    slot names (:meth:`parse`): nothing else splits one."""

    component: str
    layer: int | None = None

    @classmethod
    def parse(cls, name: str) -> SlotName:
        if name.startswith("layers."):
            _, layer, component = name.split(".", 2)
            return cls(component, int(layer))
        return cls(name)

    def __str__(self) -> str:
        return self.component if self.layer is None else f"layers.{self.layer}.{self.component}"


@dataclass(frozen=True)
class CheckedMap:
    """A source map read against one model and one batch: the slot map and every unit map as
    model indices (long, on the pass's device), the unit maps keyed by slot index."""

    slots: torch.Tensor  # [batch, seq, n_slots]
    units: dict[int, torch.Tensor]  # slot index -> [batch, seq, heads | neurons | experts]


@dataclass(frozen=True)
class SourceMap:
    """Which model serves each piece of a batch: ``slots[..., s]`` names the model of slot ``s``
    (``[batch, seq, n_slots]`` for a pass, ``[seq, n_slots]`` for one row); ``heads`` (slot name
    -> ``[..., heads]``), ``neurons`` (slot name -> ``[..., neurons]``) and ``experts`` (expert
    bank name -> ``[..., experts]``) override their slot unit by unit.

    A head map (``{"layers.3.o": [batch, seq, heads]}``) names, per head, the model whose weights
    serve it (q/k/v: the head's output columns, bias included; o: the head's input columns, while
    o's bias, which belongs to no head, comes from ``slots``). Under grouped-query attention k and
    v have ``num_key_value_heads`` heads: a k/v head is one shared key/value head, serving its
    whole group of q heads. A neuron map (``{"layers.3.up": [batch, seq, neurons]}``) grafts the
    MLP neuron by neuron (gate/up: the neuron's output column, bias entry included; down: its
    input column, its bias from ``slots``); GPT-2's ``c_fc`` and GPT-NeoX's ``dense_h_to_4h`` are
    ``up``; Phi-3's fused ``gate_up_proj`` is split into its gate and up halves first. An expert
    map grafts a mixture of experts' bank expert by expert."""

    slots: torch.Tensor
    heads: UnitMaps = field(default_factory=dict)
    neurons: UnitMaps = field(default_factory=dict)
    experts: UnitMaps = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = sorted(set(self.heads) & set(self.neurons))
        if both:
            raise GraftArgumentError(f"slot {both[0]!r} is mapped both head by head and neuron by neuron")

    @classmethod
    def of(cls, source: torch.Tensor | SourceMap, *, heads: UnitMaps | None = None, neurons: UnitMaps | None = None,
           experts: UnitMaps | None = None) -> SourceMap:
        """One map from the public loose form (``graft_forward``'s ``source`` and its
        ``head_source`` / ``neuron_source`` / ``expert_source``), so the engine takes one input."""
        if not isinstance(source, SourceMap):
            return cls(source, heads or {}, neurons or {}, experts or {})
        if heads is not None or neurons is not None or (experts is not None and source.experts):
            raise GraftArgumentError("give unit maps in the SourceMap or as head_source / neuron_source, not both")
        return source if experts is None else replace(source, experts=experts)

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

    def batch_of_one(self) -> SourceMap:
        """One row's map (``[seq, ...]``, as a :class:`GraftItem` holds it) as a batch of one."""
        return SourceMap(self.slots[None], {n: m[None] for n, m in self.heads.items()},
                         {n: m[None] for n, m in self.neurons.items()}, {n: m[None] for n, m in self.experts.items()})

    def checked(self, slot_list: Sequence[Slot], batch: int, seq: int, *, n_models: int,
                device: torch.device) -> CheckedMap:
        """The map checked against a model's slot table, a ``[batch, seq]`` pass and ``n_models``
        models: the one place a map is checked. A head or neuron map that names an expert bank
        (as a compiled scheme's ``experts`` rule gives it) is read as that bank's expert map."""
        expected = (batch, seq, len(slot_list))
        if tuple(self.slots.shape) != expected:
            raise GraftArgumentError(
                f"source must have shape [batch, seq, n_slots] = {list(expected)}, "
                f"got {list(self.slots.shape)} (see weightgraft.slots(model))"
            )
        slots = _model_indices("source", self.slots, n_models, device)
        banks = {slot.name for slot in slot_list if slot.experts}
        moved = {n: m for maps in (self.heads, self.neurons) for n, m in maps.items() if n in banks}
        heads = {n: m for n, m in self.heads.items() if n not in banks}
        neurons = {n: m for n, m in self.neurons.items() if n not in banks}
        units = _unit_maps(heads, slot_list, batch, seq, n_models, device, Units.HEAD)
        units.update(_unit_maps(neurons, slot_list, batch, seq, n_models, device, Units.NEURON))
        units.update(_expert_maps({**self.experts, **moved}, slot_list, batch, seq, n_models, device))
        return CheckedMap(slots, units)


def _unit_maps(
    unit_source: UnitMaps, slot_list: Sequence[Slot], batch: int, seq: int, n_models: int,
    device: torch.device, kind: UnitKind,
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
        out[index[name]] = _model_indices(f"{arg}[{name!r}]", tensor, n_models, device)
    return out


def _expert_maps(expert_source: UnitMaps, slot_list: Sequence[Slot], batch: int, seq: int, n_models: int,
                 device: torch.device) -> dict[int, torch.Tensor]:
    """``expert_source`` (experts slot name -> ``[batch, seq, experts]``) keyed by slot index,
    validated: expert banks only, right shapes, model indices in range."""
    index = {slot.name: s for s, slot in enumerate(slot_list)}
    out: dict[int, torch.Tensor] = {}
    for name, tensor in expert_source.items():
        slot = slot_list[index[name]] if name in index else None
        if slot is None or not slot.experts:
            banks = [s.name for s in slot_list if s.experts][:3]
            raise GraftArgumentError(f"expert_source names {name!r}, which is no expert bank of this model"
                                     + (f" (e.g. {', '.join(banks)})" if banks else " (it has none)"))
        if tuple(tensor.shape) != (batch, seq, slot.experts):
            raise GraftArgumentError(f"expert_source[{name!r}] must have shape [batch, seq, experts] = "
                                     f"{[batch, seq, slot.experts]}, got {list(tensor.shape)}")
        out[index[name]] = _model_indices(f"expert_source[{name!r}]", tensor, n_models, device)
    return out


def _model_indices(what: str, tensor: torch.Tensor, n_models: int, device: torch.device) -> torch.Tensor:
    """A map's model indices, checked (an integer tensor, each value a model) and on ``device``."""
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise GraftArgumentTypeError(f"{what} must be an integer tensor, got {tensor.dtype}")
    tensor = tensor.to(device=device, dtype=torch.long)
    if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= n_models):
        raise GraftArgumentError(
            f"{what} values must index the {n_models} models (0..{n_models - 1}), "
            f"found range {int(tensor.min())}..{int(tensor.max())}"
        )
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
