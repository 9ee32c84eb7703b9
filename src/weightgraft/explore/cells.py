"""A request's explicit cells as the engine's maps. A cell names a whole slot (``layers.3.o``)
or, as localize's found sets do (``engine.cells.cell_name``), one head (``layers.3.o/h2``), one
neuron (``layers.3.up/n17``), one expert of a mixture of experts' bank (``layers.3.experts/e2``)
or a split slot's part in no unit (``layers.3.down/bias``). They become the grafted pass's
``source`` and per-head / per-neuron / per-expert maps the way ``engine.cells`` grafts a found
set: a slot's unit row starts from its whole cell, a unit cell sets one unit, a ``/bias`` cell
the slot's own part (``source``) and no unit (a bank has none: every weight of it is an expert's).
An expert map rides with the head maps, as a compiled rule's ``experts`` does (the engine sorts
it out by the slot table: ``engine.moe.route_unit_maps``). Cells apply in order: a later
whole cell of a position and slot replaces what earlier cells set there. A cell's model may be a
scaled role of the models (``scaled(sft, 2)``, as a scaled rule's map names it: ``scaled_cells``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

import torch

from weightgraft.engine.architectures import NEURON_COMPONENTS, Slot, Units
from weightgraft.engine.cells import REST, WHOLE, parse_cell_name
from weightgraft.engine.source_map import SlotName, SourceMap
from weightgraft.errors import WeightgraftError
from weightgraft.explore.requests import Cell, RequestError
from weightgraft.models.spec import ScaledSpec, parse_scaled, written_scaled


def scaled_role(text: str, roles: Sequence[str], where: str) -> ScaledSpec | str:
    """The scaled role ``text`` names over ``roles`` (``scaled(sft, 2)``, ``scaled(pre, -1,
    base=sft)``) as its spec, whose ``text`` is its one spelling; at scale 1 the donor's role
    and at 0 the base's, as a rule's ``role_under``. Only a text that starts ``scaled(`` is read
    as a spec (so no text a client sends is looked up as a path)."""
    try:
        spec = parse_scaled(text) if written_scaled(text) else None
    except (WeightgraftError, ValueError) as exc:
        raise RequestError(f"{where}: {exc}") from None
    if spec is None:
        raise RequestError(f"{where}: model {text!r} is not one of {', '.join(roles)} or scaled(ROLE, S[, base=ROLE])")
    unknown = next((r for r in (spec.donor, spec.base) if r not in roles), None)
    if unknown is not None:
        raise RequestError(f"{where}: {text!r} scales role {unknown!r}; the models are {', '.join(roles)}")
    return spec.serving_role()


def is_scaled(text: str) -> bool:
    """Whether ``text`` is written as a scaled role (``scaled(...)``, well formed or not)."""
    return written_scaled(text)


def scaled_cells(cells: Sequence[Cell], roles: Sequence[str], base: str) -> tuple[list[Cell], str, dict[str, ScaledSpec]]:
    """``cells`` and ``base`` with every model that names a scaled role (``scaled_role``)
    written as that role's text, and those roles by text, in order of first use (after ``roles``
    in the map's role order). A model that is neither is left to ``cell_maps``, which names it."""
    scaled: dict[str, ScaledSpec] = {}

    def named(text: str, where: str) -> str:
        if text in roles or not is_scaled(text):
            return text
        role = scaled_role(text, roles, where)
        if isinstance(role, str):
            return role
        scaled.setdefault(role.text, role)
        return role.text

    base = named(base, "base")
    out = [c if c.model in roles else c.model_copy(update={"model": named(c.model, f"cells.{k}")})
           for k, c in enumerate(cells)]
    return out, base, scaled


def split_of(slot: Slot) -> tuple[str, int] | None:
    """What a slot splits into for the page, and how many: ``("head", 12)``, ``("neuron", 64)``,
    ``("expert", 8)`` for a mixture of experts' bank; None for a whole-only slot."""
    if slot.experts:
        return "expert", slot.experts
    kind = slot.unit_kind()
    return (str(kind), slot.units(kind)) if kind is not None else None


def max_cells(n_tokens: int, slot_list: Sequence[Slot]) -> int:
    """The most cells a prompt can be given: each slot, its every unit and its rest, per token."""
    return n_tokens * sum(2 + (split[1] if (split := split_of(s)) else 0) for s in slot_list)


def _unit(k: int, cell: Cell, slot: Slot, unit: int) -> None:
    """Refuse a unit the slot does not have, a head named as a neuron (and back), a bank's rest."""
    split = split_of(slot)
    if split is None:
        raise RequestError(f"cells.{k}: {slot.name} has no heads or neurons and is no expert bank; {cell.slot!r} names a unit of it")
    kind, n = split
    letter = "e" if slot.experts else "n" if SlotName.parse(slot.name).component in NEURON_COMPONENTS else "h"
    if unit == REST and slot.experts:
        raise RequestError(f"cells.{k}: {slot.name} is a bank of {n} experts with no part outside them: "
                           f"write {slot.name}/e<index>")
    if unit != REST and not cell.slot.rsplit("/", 1)[-1].startswith(letter):
        raise RequestError(f"cells.{k}: {slot.name} splits into {kind}s: write {slot.name}/{letter}<index>")
    if unit != REST and not 0 <= unit < n:
        raise RequestError(f"cells.{k}: {slot.name} has {n} {kind}s (0..{n - 1}); no {kind} {unit}")


def cell_maps(cells: Sequence[Cell], n_tokens: int, slot_list: Sequence[Slot], roles: Sequence[str],
              base: str) -> SourceMap:
    """The maps of ``cells`` over ``base`` (role indices in ``roles``' order), each cell checked."""
    if len(cells) > max_cells(n_tokens, slot_list):
        raise RequestError(f"{len(cells)} cells for a prompt of {max_cells(n_tokens, slot_list)} cells and units")
    role = {r: i for i, r in enumerate(roles)}
    index = {s.name: i for i, s in enumerate(slot_list)}
    whole = torch.full((n_tokens, len(slot_list)), role[base], dtype=torch.long)
    rest: dict[tuple[int, int], int] = {}  # (position, slot) -> role of the slot's part in no unit
    units: dict[int, dict[tuple[int, int], int]] = {}  # slot -> (position, unit) -> role
    for k, cell in enumerate(cells):
        if not 0 <= cell.position < n_tokens:
            raise RequestError(f"cells.{k}: position {cell.position} is outside the prompt's {n_tokens} tokens (0..{n_tokens - 1})")
        try:
            name, unit = parse_cell_name(cell.slot)
        except ValueError as exc:
            raise RequestError(f"cells.{k}: {exc}") from None
        if name not in index:
            names = [s.name for s in slot_list]
            raise RequestError(f"cells.{k}: unknown slot {name!r}; slots look like "
                               f"{', '.join(names[:3])}, ..., {names[-1]} (a head: layers.0.o/h1, a neuron: layers.0.up/n7)")
        if cell.model not in role:
            raise RequestError(f"cells.{k}: model {cell.model!r} is not one of {', '.join(roles)}")
        s, r = index[name], role[cell.model]
        if unit == WHOLE:
            whole[cell.position, s] = r
            rest.pop((cell.position, s), None)
            for key in [key for key in units.get(s, {}) if key[0] == cell.position]:
                del units[s][key]
            continue
        _unit(k, cell, slot_list[s], unit)
        if unit == REST:
            rest[(cell.position, s)] = r
            units.setdefault(s, {})
        else:
            units.setdefault(s, {})[(cell.position, unit)] = r
    slots = whole.clone()
    heads: dict[str, torch.Tensor] = {}
    neurons: dict[str, torch.Tensor] = {}
    for (t, s), r in rest.items():
        slots[t, s] = r
    for s, chosen in units.items():
        if not chosen and not any(key[1] == s for key in rest):
            continue  # every unit cell of the slot replaced by a whole cell: no map
        slot = slot_list[s]
        split = split_of(slot)
        assert split is not None  # _unit refused the others
        maps = whole[:, s, None].repeat(1, split[1])
        for (t, u), r in chosen.items():
            maps[t, u] = r
        (neurons if slot.unit_kind() == Units.NEURON else heads)[slot.name] = maps  # (an expert map rides with heads)
    return SourceMap(slots, heads, neurons)


class UnitRows(TypedDict):
    """One unit-mapped slot's rows that differ from its cell: ``rows`` is ``[[position, [role per
    unit]], ...]``."""

    kind: str  # head | neuron | expert
    n: int
    rows: list[list[int | list[int]]]


def unit_rows(source: torch.Tensor, maps: Mapping[str, torch.Tensor], slot_index: Mapping[str, int],
              kind: str | Mapping[str, str]) -> dict[str, UnitRows]:
    """The rows of unit maps that differ from their cell (``source``), as the page draws and
    resends them: ``{slot: {"kind", "n", "rows": [[position, [role per unit]], ...]}}``; ``kind``
    one for all maps or by slot name (head maps carry expert maps)."""
    out: dict[str, UnitRows] = {}
    for name, m in maps.items():
        own = source[:, slot_index[name], None]
        changed = (m != own).any(dim=1).nonzero().flatten().tolist()
        rows: list[list[int | list[int]]] = [[t, m[t].tolist()] for t in changed]
        if rows:
            out[name] = UnitRows(kind=kind if isinstance(kind, str) else kind[name], n=int(m.shape[1]), rows=rows)
    return out
