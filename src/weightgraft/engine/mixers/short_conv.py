"""LFM2's short convolution (``Lfm2ShortConv``) with every weight per position.

``in_proj`` gives ``[B | C | x]`` per token; the depthwise causal conv runs over ``u = B * x``;
``out_proj`` follows ``C * conv(u)``. The conv kernel is the one weight applied to earlier
positions' values: output p is ``sum_j W_p[:, j] u[p - K + 1 + j] (+ b_p)``, each ``u[q]`` as q's
own model computed it (what the conv state caches), so p's kernel runs over a window of mixed
inputs. ``in_proj`` and ``out_proj`` are per-token projections: the engine's module swaps serve
them (``mixer_b`` / ``mixer_c`` / ``mixer_x`` are column groups of ``in_proj``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache

from weightgraft.engine.mixers.pieces import kernels, per_position_conv, single_model, zero_pads
from weightgraft.engine.swaps import own_forward

__all__ = ["OWN", "short_conv_forward"]

OWN = frozenset({"mixer_conv"})  # computed here; the projections go through the module swaps


def short_conv_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A forward for the base's ``Lfm2ShortConv``: ``targets`` are each model's, ``maps``
    (component -> ``[batch, seq]``) name the model serving each component at each position."""
    mixers: list[Any] = targets  # transformers modules: their submodules and sizes are plain attributes
    base = mixers[0]
    single = single_model(list(maps.values()))
    whole = own_forward(base) if single == 0 else targets[single] if single is not None else None
    conv = maps["mixer_conv"]

    def forward(hidden_states: torch.Tensor, past_key_values: Cache | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        if whole is not None and attention_mask is None:  # one model, no padding: its own forward
            out: torch.Tensor = whole(hidden_states, past_key_values=past_key_values,
                                      attention_mask=attention_mask, **kwargs)
            return out
        x = zero_pads(hidden_states, attention_mask)
        b, c, xx = base.in_proj(x).chunk(3, dim=-1)  # each column group from the model serving it
        u = zero_pads(b * xx, attention_mask)  # with an in_proj bias, a pad's u is not zero
        full = u.transpose(1, 2)
        if past_key_values is not None:  # earlier positions' u first (the conv state), then the new ones
            full = past_key_values.update_conv_state(full, base.layer_idx, conv_kernel_size=base.conv_kernel_size)
        weight, bias = kernels([t.conv for t in mixers])
        y = c * per_position_conv(full, weight, bias, conv.to(x.device)).to(c.dtype)
        projected: torch.Tensor = base.out_proj(y)
        return projected

    return forward
