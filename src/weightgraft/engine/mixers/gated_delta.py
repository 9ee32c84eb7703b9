"""Gated DeltaNet with every weight per position: Qwen3.5's (``Qwen3_5GatedDeltaNet``), Qwen3-Next's
and OLMo Hybrid's (``OlmoHybridGatedDeltaNet``), which differ only in how their per-token inputs are
projected and named.

Per token, through the engine's module swaps: q, k and v into the conv (Qwen3.5 fuses them in
``in_proj_qkv``, OLMo Hybrid projects each), the output gate z, the write strength beta (OLMo
Hybrid doubles it where ``allow_neg_eigval``), the decay input a. Here: the causal conv with each
position's kernel over each position's own-model inputs (the conv state), the decay ``g =
-exp(A_log) softplus(a + dt_bias)`` with p's model's ``A_log`` and ``dt_bias``, the gated norm at
each position by its model, and the family's own gated delta rule run once over the mixed per-token
inputs: no weight lives inside the scan (l2 norms of q and k, the delta rule), so the recurrent
state carries earlier positions as their own models wrote it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.models.olmo_hybrid import modeling_olmo_hybrid as olmo_hybrid
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

from weightgraft.engine.mixers.pieces import by_rows, gathered, kernels, mixer_models, per_position_conv, zero_pads

__all__ = ["OWN", "gated_delta_forward", "next_gated_delta_forward", "olmo_gated_delta_forward"]

OWN = frozenset({"mixer_conv", "mixer_decay", "mixer_norm"})  # computed here; projections go through the swaps


@dataclass(frozen=True)
class _Family:
    """Where one family's Gated DeltaNet keeps its per-token projections, and its delta rules."""

    inputs: Callable[[Any, torch.Tensor], tuple[torch.Tensor, ...]]  # (conv input, z, b, a) of x
    norm: str  # the gated norm's attribute
    out: str  # the output projection's attribute
    rules: ModuleType  # the family's modeling module: its recurrent and chunked delta rules
    beta_scale: Callable[[Any], float]


def _qwen_inputs(base: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return base.in_proj_qkv(x), base.in_proj_z(x), base.in_proj_b(x), base.in_proj_a(x)


def _next_inputs(base: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v, z, b, a = base.fix_query_key_value_ordering(base.in_proj_qkvz(x), base.in_proj_ba(x))
    mixed = torch.cat([t.reshape(*t.shape[:2], -1) for t in (q, k, v)], dim=-1)
    return mixed, z, b, a


def _olmo_inputs(base: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    mixed = torch.cat([base.q_proj(x), base.k_proj(x), base.v_proj(x)], dim=-1)
    return mixed, base.g_proj(x), base.b_proj(x), base.a_proj(x)


_QWEN3_5 = _Family(_qwen_inputs, "norm", "out_proj", qwen3_5, lambda base: 1.0)
_QWEN3_NEXT = _Family(_next_inputs, "norm", "out_proj", qwen3_next, lambda base: 1.0)
_OLMO_HYBRID = _Family(_olmo_inputs, "o_norm", "o_proj", olmo_hybrid,
                       lambda base: 2.0 if base.allow_neg_eigval else 1.0)


def gated_delta_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A forward for the base's Qwen3.5 Gated DeltaNet: ``targets`` are each model's, ``maps``
    (component -> ``[batch, seq]``) name the model serving each component at each position."""
    return _forward(_QWEN3_5, targets, maps)


def next_gated_delta_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The same for Qwen3-Next's (q, k, v and z interleaved per key head in ``in_proj_qkvz``, b and a in
    ``in_proj_ba``: the module's own reordering splits them)."""
    return _forward(_QWEN3_NEXT, targets, maps)


def olmo_gated_delta_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The same for OLMo Hybrid's Gated DeltaNet (separate q/k/v projections into the conv)."""
    return _forward(_OLMO_HYBRID, targets, maps)


def _forward(family: _Family, targets: list[nn.Module],
             maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    mixers: list[Any] = targets  # transformers modules: their submodules and sizes are plain attributes
    base, whole, norms = mixer_models(targets, list(maps.values()), norm=family.norm)

    def forward(hidden_states: torch.Tensor, cache_params: Cache | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        if whole is not None and attention_mask is None:  # one model, no padding: its own forward
            out: torch.Tensor = whole(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
            return out
        here = {name: m.to(hidden_states.device) for name, m in maps.items()}
        x = zero_pads(hidden_states, attention_mask)
        batch, seq, _ = x.shape
        mixed, z, b, a = family.inputs(base, x)
        mixed = zero_pads(mixed, attention_mask).transpose(1, 2)  # [batch, channels, seq]
        z = z.reshape(batch, seq, -1, base.head_v_dim)
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
        beta = b.sigmoid()
        scale = family.beta_scale(base)
        if scale != 1.0:
            beta = beta * scale
        recurrent = state is not None and seq == 1
        rule = family.rules.torch_recurrent_gated_delta_rule if recurrent else family.rules.torch_chunk_gated_delta_rule
        core, last = rule(q, k, v, g=g, beta=beta, initial_state=state,
                          output_final_state=cache_params is not None, use_qk_l2norm_in_kernel=True)
        if cache_params is not None:
            cache_params.update_recurrent_state(last, base.layer_idx)
        core = by_rows(norms, here["mixer_norm"], core, z)  # [batch, seq, heads, head_v_dim]
        projected: torch.Tensor = getattr(base, family.out)(core.reshape(batch, seq, -1))
        return projected

    return forward
