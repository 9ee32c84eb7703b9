"""Qwen3.5's Gated DeltaNet (``Qwen3_5GatedDeltaNet``) with every weight per position.

Per token: ``in_proj_qkv`` (``[q | k | v]``, into the conv), ``in_proj_z`` (output gate),
``in_proj_b`` (write strength beta), ``in_proj_a`` (decay input): the engine's module swaps serve
them. Here: the causal conv with each position's kernel over each position's own-model inputs (the
conv state), the decay ``g = -exp(A_log) softplus(a + dt_bias)`` with p's model's ``A_log`` and
``dt_bias``, the gated norm at each position by its model, and transformers' own gated delta rule
run once over the mixed per-token inputs: no weight lives inside the scan (l2 norms of q and k,
the delta rule), so the recurrent state carries earlier positions as their own models wrote it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5

from weightgraft.engine.mixers.pieces import by_rows, gathered, kernels, mixer_models, per_position_conv, zero_pads

__all__ = ["OWN", "gated_delta_forward"]

OWN = frozenset({"mixer_conv", "mixer_decay", "mixer_norm"})  # computed here; projections go through the swaps


def gated_delta_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A forward for the base's Gated DeltaNet: ``targets`` are each model's, ``maps`` (component
    -> ``[batch, seq]``) name the model serving each component at each position."""
    mixers: list[Any] = targets  # transformers modules: their submodules and sizes are plain attributes
    base, whole, norms = mixer_models(targets, list(maps.values()))

    def forward(hidden_states: torch.Tensor, cache_params: Cache | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        if whole is not None and attention_mask is None:  # one model, no padding: its own forward
            out: torch.Tensor = whole(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
            return out
        here = {name: m.to(hidden_states.device) for name, m in maps.items()}
        x = zero_pads(hidden_states, attention_mask)
        batch, seq, _ = x.shape
        mixed = zero_pads(base.in_proj_qkv(x), attention_mask).transpose(1, 2)  # [batch, channels, seq]
        z = base.in_proj_z(x).reshape(batch, seq, -1, base.head_v_dim)
        b, a = base.in_proj_b(x), base.in_proj_a(x)
        state = None
        if cache_params is not None:  # earlier positions' conv inputs first, then the new ones
            state = cache_params.get_recurrent_state(base.layer_idx, state_idx=0)
            mixed = cache_params.update_conv_state(mixed, base.layer_idx, conv_kernel_size=base.conv_kernel_size)
        weight, bias = kernels([t.conv1d for t in mixers])
        qkv = ACT2FN[base.activation](per_position_conv(mixed, weight, bias, here["mixer_conv"])).to(x.dtype)
        q, k, v = torch.split(qkv, [base.key_dim, base.key_dim, base.value_dim], dim=-1)
        q = q.reshape(batch, seq, -1, base.head_k_dim)
        k = k.reshape(batch, seq, -1, base.head_k_dim)
        v = v.reshape(batch, seq, -1, base.head_v_dim)
        A_log = gathered([t.A_log for t in mixers], here["mixer_decay"])  # [batch, seq, heads]: p's model's
        dt_bias = gathered([t.dt_bias for t in mixers], here["mixer_decay"])
        g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
        rule = qwen3_5.torch_recurrent_gated_delta_rule if state is not None and seq == 1 else qwen3_5.torch_chunk_gated_delta_rule
        core, last = rule(q, k, v, g=g, beta=b.sigmoid(), initial_state=state,
                          output_final_state=cache_params is not None, use_qk_l2norm_in_kernel=True)
        if cache_params is not None:
            cache_params.update_recurrent_state(last, base.layer_idx)
        core = by_rows(norms, here["mixer_norm"], core, z)  # [batch, seq, heads, head_v_dim]
        projected: torch.Tensor = base.out_proj(core.reshape(batch, seq, -1))
        return projected

    return forward
