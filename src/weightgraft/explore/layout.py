"""How the page draws a model's slots: a position x layer grid per component group (attention
q/k/v, a hybrid's recurrent mixer, o, FFN, a mixture of experts' router, expert bank and shared
experts, norms) and rows for the slots outside the layers (embedding, final norm, unembedding).
Painting a grid cell assigns every slot of its group at that layer; a layer without the group
(a hybrid's mixer layer has no q/k/v, a dense layer of an MoE no router) has no slot there. The
router and the bank are grids of their own, so that each can be grafted without the other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from weightgraft.engine.architectures import MIXER_COMPONENTS
from weightgraft.engine.source_map import SlotName

# group -> (title, components); a component the architecture lacks is simply absent
LAYER_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "attn": ("attention q/k/v", ("q", "k", "v", "attn_gate", "sinks")),
    "mixer": ("recurrent mixer", MIXER_COMPONENTS),
    "o": ("attention output o", ("o",)),
    "ffn": ("FFN gate/up/down", ("gate", "up", "down")),
    "router": ("MoE router", ("router",)),
    "experts": ("MoE experts (the expert list above the grids paints single experts)", ("experts",)),
    "shared": ("MoE shared experts", ("shared_expert_gate", "shared_gate", "shared_up", "shared_down")),
    "norms": ("norms", ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")),
}
GLOBAL_ROWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "embed": ("embedding", ("embed", "pos_embed")),
    "final_norm": ("final norm", ("final_norm",)),
    "unembed": ("unembedding", ("unembed",)),
}


def slot_parts(name: str) -> tuple[int | None, str]:
    """``layers.3.o`` -> (3, "o"); ``embed`` -> (None, "embed")."""
    slot = SlotName.parse(name)
    return slot.layer, slot.component


class Grid(TypedDict):
    """A layer group's grid: its components (those the model has) and, per layer, their slot indices."""

    key: str
    title: str
    components: list[str]
    layers: list[list[int]]


class Row(TypedDict):
    """A row of slots outside the layers (embedding, final norm, unembedding)."""

    key: str
    title: str
    slots: list[int]


class Layout(TypedDict):
    n_layers: int
    grids: list[Grid]
    rows: list[Row]


def layout(slot_names: Sequence[str]) -> Layout:
    """The grids the page draws: per layer group, per layer, the slot indices of the group;
    per global row, its slot indices. Every slot belongs to exactly one grid or row."""
    n_layers = 1 + max((layer for layer, _ in map(slot_parts, slot_names) if layer is not None), default=-1)
    grids: list[Grid] = []
    for key, (title, comps) in LAYER_GROUPS.items():
        per_layer = [[i for i, n in enumerate(slot_names) if slot_parts(n) in {(layer, c) for c in comps}]
                     for layer in range(n_layers)]
        if any(per_layer):
            grids.append(Grid(key=key, title=title, components=[c for c in comps if any(
                slot_parts(n) == (lay, c) for n in slot_names for lay in range(n_layers))], layers=per_layer))
    rows: list[Row] = []
    for key, (title, comps) in GLOBAL_ROWS.items():
        idx = [i for i, n in enumerate(slot_names) if n in comps]
        if idx:
            rows.append(Row(key=key, title=title, slots=idx))
    covered = {i for g in grids for ls in g["layers"] for i in ls} | {i for r in rows for i in r["slots"]}
    missing = [n for i, n in enumerate(slot_names) if i not in covered]
    if missing:  # a new component name must get a place on the page, not vanish from it
        raise ValueError(f"explore has no grid for slot(s) {', '.join(missing[:3])}")
    return Layout(n_layers=n_layers, grids=grids, rows=rows)
