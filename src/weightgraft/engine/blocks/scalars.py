"""A block's output scale per position (Gemma 4's ``layer_scalar``: ``hidden *= layer_scalar``, the
block's last step, a buffer no module call applies).

The per-token definition: at position p the block's output is scaled by p's model's scalar. The
block runs once with its scalar set to one (``x * 1`` is ``x`` exactly), then each position is
multiplied by its model's scalar: the same product the block computes, so a uniform map gives
each model's output bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from weightgraft.engine.architectures import Slot
from weightgraft.engine.swaps import Swaps, own_forward

__all__ = ["swap_scalars"]


def swap_scalars(swap: Swaps, targets: Callable[[str], list[nn.Module]], base: nn.Module, slot_list: list[Slot],
                 columns: list[torch.Tensor], donors: list[bool]) -> set[str]:
    """Every block whose scalar some donor serves somewhere runs a forward that scales each
    position by its model's scalar. Returns those blocks' paths, which the engine must not swap
    besides (the modules inside a block are swapped as usual)."""
    taken: set[str] = set()
    for s, slot in enumerate(slot_list):
        if not (slot.scalar and donors[s]):
            continue
        part = slot.parts[0]
        (name,) = part.tensors or ()
        block = base.get_submodule(part.path)
        values = torch.stack([getattr(t, name) for t in targets(part.path)])  # [models, *scalar shape]
        swap.forward(block, _scaled_forward(block, name, values, columns[s]))
        taken.add(part.path)
    return taken


def _scaled_forward(block: nn.Module, name: str, values: torch.Tensor, models: torch.Tensor) -> Callable[..., Any]:
    own = own_forward(block)
    base_value: torch.Tensor = getattr(block, name)

    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        setattr(block, name, torch.ones_like(base_value))
        try:
            out: torch.Tensor = own(*args, **kwargs)
        finally:
            setattr(block, name, base_value)
        here = models.to(out.device)
        return out * values.to(out.device)[here]  # [batch, seq, 1]: each position's own scalar

    return forward
