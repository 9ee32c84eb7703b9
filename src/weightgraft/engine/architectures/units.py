"""A concrete model's slots: each a name and the module parts (a module, or output columns of a
fused projection) that it consists of, and the units (attention heads, MLP neurons) it splits into."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

import torch
from torch import nn

from weightgraft.engine import projections
from weightgraft.engine.architectures.adapter import MixerKind
from weightgraft.errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class Part:
    """One module (or column subset of one) that a slot consists of, bound to a model."""

    path: str  # full dotted path from the CausalLM root
    columns: torch.Tensor | None  # output columns the slot owns; None = the whole output
    # which axis of the module's input/output is the token position; FLAT: the module sees the
    # batch's positions flattened into rows ``[batch * seq, ...]`` (a mixture of experts' router
    # and experts), row ``b * seq + t`` being position t of sequence b
    pos_axis: int
    # the module's own tensors the part owns, by name (a mixer's ``A_log`` / ``dt_bias``); None:
    # all its parameters and persistent buffers (:func:`weightgraft.engine.architectures.slots.part_state`)
    tensors: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MixerSite:
    """Where a recurrent mixer's component is computed: by the batched forward of ``kind`` that
    replaces the mixer module at ``path`` for a pass, which reads every component's map."""

    path: str  # the mixer module (``model.layers.0.linear_attn``)
    kind: MixerKind
    component: str  # ``mixer_conv``, ...


FLAT = 0  # ``Part.pos_axis`` of a module that sees ``[batch * seq, ...]`` rows


# Components that can be grafted head by head, and which side of the module the heads are on:
# q/k/v heads are groups of output columns, o's heads are groups of its input columns. Under
# grouped-query attention k and v have ``num_key_value_heads`` heads: one k/v head's columns
# serve its whole group of q heads, so a k/v head is that shared key/value head, not a q head's.
HEAD_COMPONENTS: dict[str, Literal["out", "in"]] = {"q": "out", "k": "out", "v": "out", "o": "in"}
# Components that can be grafted neuron by neuron (MLP neurons): a neuron of gate/up is one
# output column (its bias entry included), of down one input column (down's bias belongs to no
# neuron). GPT-2's ``c_fc`` and GPT-NeoX's ``dense_h_to_4h`` are ``up``.
NEURON_COMPONENTS: dict[str, Literal["out", "in"]] = {
    "gate": "out", "up": "out", "down": "in",
    "shared_gate": "out", "shared_up": "out", "shared_down": "in",  # a mixture of experts' shared experts
}


class Units(str, Enum):
    """A map's cell: a whole slot, or a slot split into attention heads (q/k/v/o) or MLP
    neurons (gate/up/down); parsed once from a localize config, taken by every module after."""

    CELL = "cell"
    HEAD = "head"
    NEURON = "neuron"

    def __str__(self) -> str:
        return self.value


UnitKind = Literal[Units.HEAD, Units.NEURON]  # the units a slot can split into


@dataclass(frozen=True)
class Slot:
    """A graftable slot of a concrete model: its name and the module parts it consists of.

    ``heads`` is the number of attention heads the slot can be split into (0: not per-head),
    ``head_side`` whether a head is a group of output (q/k/v) or input (o) columns.
    """

    name: str
    parts: tuple[Part, ...]
    heads: int = 0
    head_side: Literal["out", "in"] | None = None
    neurons: int = 0  # MLP neurons (gate/up: output columns, down: input columns); 0: not per-neuron
    neuron_side: Literal["out", "in"] | None = None
    experts: int = 0  # a mixture of experts' expert bank: the experts (index 0 of each tensor); 0: none
    router: bool = False  # a mixture of experts' router: its outputs are tuples of [batch * seq] rows
    mixer: MixerSite | None = None  # a recurrent mixer's component: computed by its mixer's forward
    sinks: bool = False  # attention sinks (gpt-oss): read by the attention function, per query row
    scalar: bool = False  # a block's output scale (Gemma 4's ``layer_scalar``): applied per position by its block

    def units(self, kind: Units) -> int:
        """How many units of ``kind`` (heads or neurons) the slot splits into (0: none, and
        for ``Units.CELL``)."""
        return self.heads if kind == Units.HEAD else self.neurons if kind == Units.NEURON else 0

    def unit_side(self, kind: Units) -> Literal["out", "in"] | None:
        """Whether a unit of ``kind`` is a group of output or of input columns."""
        return self.head_side if kind == Units.HEAD else self.neuron_side if kind == Units.NEURON else None

    def unit_kind(self) -> UnitKind | None:
        """``Units.HEAD`` for q/k/v/o, ``Units.NEURON`` for gate/up/down, else None."""
        return Units.HEAD if self.heads else Units.NEURON if self.neurons else None

    def head_columns(self, module: nn.Module) -> list[torch.Tensor]:
        """Per head, the columns of ``module`` (output side for q/k/v, input side for o)."""
        return self.unit_columns(module, Units.HEAD)

    def unit_columns(self, module: nn.Module, kind: Units) -> list[torch.Tensor]:
        """Per unit (head or neuron), the columns of ``module`` it owns (output side for
        q/k/v/gate/up, input side for o/down)."""
        part = self.parts[0]
        n, side = self.units(kind), self.unit_side(kind)
        if side == "in":
            width = _in_features(module)
            cols = torch.arange(width)
        else:
            cols = part.columns if part.columns is not None else torch.arange(_out_features(module))
        if not n or cols.numel() % n:
            raise UnsupportedArchitectureError(
                f"slot {self.name} cannot be split into {n} {kind}s ({cols.numel()} columns)"
            )
        return list(cols.view(n, -1))




def _out_features(module: nn.Module) -> int:
    try:
        return projections.out_features(module)
    except projections.UnsupportedProjection as exc:
        raise UnsupportedArchitectureError(f"fused component on a {exc}") from exc


def _in_features(module: nn.Module) -> int:
    try:
        return projections.in_features(module)
    except projections.UnsupportedProjection as exc:
        raise UnsupportedArchitectureError(f"per-head o / per-neuron down on a {exc}") from exc
