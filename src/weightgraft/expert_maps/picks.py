"""Which experts the serving router picks at each position of a pass, grafted or plain.

Why from the base's bank: in a grafted pass the engine runs the router that serves each position
(the base's or a donor's) and hands the picks to the base's bank module, whatever model then
computes each expert; a pre-hook there reads the picks the pass actually used, so the overlay of
an expert map is what the grafted pass did, never a guess from another pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine.architectures import model_slots
from weightgraft.engine.forward import graft_forward

__all__ = ["Routing", "routing_picks"]


@dataclass(frozen=True)
class Routing:
    """The picks of one pass: per expert bank (slot name), ``experts`` ``[batch, seq, k]`` the
    picked experts and ``weights`` ``[batch, seq, k]`` their routing weights."""

    experts: Mapping[str, torch.Tensor]
    weights: Mapping[str, torch.Tensor]

    def picked(self, bank: str, n_experts: int) -> torch.Tensor:
        """``[batch, seq, n_experts]`` bool: whether each expert is picked at each position."""
        picks = self.experts[bank]
        out = torch.zeros(*picks.shape[:-1], n_experts, dtype=torch.bool, device=picks.device)
        return out.scatter_(-1, picks, True)


def _arguments(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(top_k_index, top_k_weights)`` of a bank's call ``(states, top_k_index, top_k_weights)``."""
    index = args[1] if len(args) > 1 else kwargs["top_k_index"]
    weights = args[2] if len(args) > 2 else kwargs["top_k_weights"]
    return index, weights


@torch.no_grad()
def routing_picks(models: Sequence[nn.Module], input_ids: torch.Tensor, source: torch.Tensor | None = None, *,
                  attention_mask: torch.Tensor | None = None,
                  expert_source: Mapping[str, torch.Tensor] | None = None) -> Routing:
    """The experts the serving router picks at each position of ``graft_forward(models, ...)``
    (``source`` None: ``models[0]`` alone, a plain pass)."""
    base = models[0]
    banks = [s for s in model_slots(base) if s.experts]
    shape = tuple(input_ids.shape)
    experts: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    hooks = []
    for slot in banks:
        def record(_module: nn.Module, args: tuple, kwargs: dict, name: str = slot.name) -> None:
            index, w = _arguments(args, kwargs)
            experts[name] = index.detach().reshape(*shape, -1).clone()
            weights[name] = w.detach().reshape(*shape, -1).clone()
        hooks.append(base.get_submodule(slot.parts[0].path).register_forward_pre_hook(record, with_kwargs=True))
    try:
        if source is None:
            source = torch.zeros(*shape, len(model_slots(base)), dtype=torch.long)
        graft_forward(list(models), input_ids, source, attention_mask=attention_mask, expert_source=expert_source)
    finally:
        for h in hooks:
            h.remove()
    return Routing(experts, weights)
