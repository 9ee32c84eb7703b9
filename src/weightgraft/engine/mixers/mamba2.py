"""Mamba2's state space mixer (Nemotron-H's ``NemotronHMamba2Mixer``; Falcon-H1's ``FalconH1Mixer``,
which scales its input by ``ssm_in_multiplier`` and ``in_proj``'s output by the config's muP vector,
and gates by ``silu(z)`` where it has no norm) with every weight per position.

Per token: ``in_proj`` (``[z | x | B | C | dt]``: the gate, the input, the state's write and read
projections, the step input; column groups the engine's module swaps serve) and ``out_proj``. Here:
the causal conv over ``x | B | C`` with each position's kernel and bias over each position's
own-model inputs (the conv state), the step ``dt = clamp(softplus(dt + dt_bias), time_step_min)`` and
``A = -exp(A_log)`` with p's model's ``A_log`` and ``dt_bias``, transformers' own chunked scan run
once over the mixed per-token inputs (no weight lives inside it), the skip ``D x`` with p's model's
``D`` (added here: the scan's own ``D`` is one vector for the batch), and the group-wise gated norm
at each position by its model.

The definition follows transformers' batched (prefill) forward, whose scan floors the step at
``time_step_min``; its one-token decode step does not. So every step here is floored, a continued
cache's one-token steps too, and the per-token reference floors its decode steps alike
(:func:`decode_step_floor`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.models.falcon_h1 import modeling_falcon_h1 as falcon_h1
from transformers.models.nemotron_h import modeling_nemotron_h as nemotron_h

from weightgraft.engine.mixers.pieces import by_rows, gathered, kernels, mixer_models, per_position_conv, zero_pads

__all__ = ["OWN", "decode_step_floor", "falcon_mamba2_forward", "mamba2_forward"]

OWN = frozenset({"mixer_conv", "mixer_decay", "mixer_skip", "mixer_norm"})  # the projections go through the swaps


@dataclass(frozen=True)
class _Family:
    """What one family's Mamba2 mixer does around the shared steps: its scan, and its muP scales."""

    scan: ModuleType  # the family's modeling module, whose ``mamba2_chunk_scan`` runs the scan
    normed: Callable[[Any], bool]  # whether the mixer gates through its norm (else by ``silu(z)``)
    muP: bool = False  # input times ``ssm_in_multiplier``, in_proj's output times ``mup_vector`` (Falcon-H1)


_NEMOTRON_H = _Family(nemotron_h, lambda base: True)
_FALCON_H1 = _Family(falcon_h1, lambda base: bool(base.mamba_rms_norm), muP=True)


def mamba2_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A forward for the base's Mamba2 mixer: ``targets`` are each model's, ``maps`` (component ->
    ``[batch, seq]``) name the model serving each component at each position."""
    return _forward(_NEMOTRON_H, targets, maps)


def falcon_mamba2_forward(targets: list[nn.Module], maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The same for Falcon-H1's mixer (its multipliers are the config's: every model's alike)."""
    return _forward(_FALCON_H1, targets, maps)


def _forward(family: _Family, targets: list[nn.Module],
             maps: Mapping[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    mixers: list[Any] = targets  # transformers modules: their submodules and sizes are plain attributes
    base, whole, norms = mixer_models(targets, list(maps.values()))

    def forward(hidden_states: torch.Tensor, cache_params: Cache | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        batch, seq, _ = hidden_states.shape
        # one model, no padding: its own forward (but not its one-token decode step, which skips the floor)
        if whole is not None and attention_mask is None and (cache_params is None or seq > 1):
            out: torch.Tensor = whole(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
            return out
        here = {name: m.to(hidden_states.device) for name, m in maps.items()}
        dtype = hidden_states.dtype
        x = zero_pads(hidden_states, attention_mask)
        heads, head_dim, groups, state = base.num_heads, base.head_dim, base.n_groups, base.ssm_state_size
        inputs = base.in_proj(x * base.ssm_in_multiplier) * base.mup_vector if family.muP else base.in_proj(x)
        gate, xbc, dt = inputs.split([base.intermediate_size, base.conv_dim, heads], dim=-1)
        mixed = zero_pads(xbc, attention_mask).transpose(1, 2)  # with an in_proj bias a pad's input is not zero
        previous = None
        if cache_params is not None:  # earlier positions' conv inputs first, then the new ones
            previous = cache_params.get_recurrent_state(base.layer_idx, state_idx=0)
            mixed = cache_params.update_conv_state(mixed, base.layer_idx, conv_kernel_size=base.conv_kernel_size)
        weight, bias = kernels([t.conv1d for t in mixers])
        conv = ACT2FN[base.activation](per_position_conv(mixed, weight, bias, here["mixer_conv"])).to(dtype)
        conv = zero_pads(conv, attention_mask)  # the conv bias: a pad's output would write into the state
        xs, B, C = torch.split(conv, [base.intermediate_size, groups * state, groups * state], dim=-1)
        xs = xs.reshape(batch, seq, heads, head_dim)
        A = -gathered([t.A_log for t in mixers], here["mixer_decay"]).float().exp()  # [batch, seq, heads]: p's
        dt_bias = gathered([t.dt_bias for t in mixers], here["mixer_decay"])
        scanned = family.scan.mamba2_chunk_scan(
            xs, dt, A, B.reshape(batch, seq, groups, state), C.reshape(batch, seq, groups, state),
            chunk_size=base.chunk_size, D=None, dt_bias=dt_bias, dt_softplus=True, initial_states=previous,
            dt_limit=base.time_step_limit, return_final_states=cache_params is not None)
        y = scanned[0] if cache_params is not None else scanned
        if cache_params is not None:
            cache_params.update_recurrent_state(scanned[1], layer_idx=base.layer_idx)
        D = gathered([t.D for t in mixers], here["mixer_skip"])  # [batch, seq, heads]
        y = (y + D[..., None] * xs.float()).reshape(batch, seq, -1)
        if family.normed(base):  # Nemotron-H always; Falcon-H1 where its config says
            y = by_rows(norms, here["mixer_norm"], y, gate)
        else:  # no norm: the gate alone, as Falcon-H1 applies it
            y = y * F.silu(gate)
        projected: torch.Tensor = base.out_proj(y.to(dtype))
        return projected

    return forward


@contextmanager
def decode_step_floor(models: list[nn.Module]) -> Iterator[None]:
    """Within it, transformers' one-token Mamba2 decode step floors the step at the mixer's
    ``time_step_limit`` as its batched scan does (the definition: :mod:`weightgraft.engine.mixers.mamba2`),
    so a token-by-token pass equals the batched one; restored on exit. A no-op without Mamba2 mixers."""
    limits = {m.time_step_limit for model in models for m in model.modules()
              if isinstance(m, nemotron_h.NemotronHMamba2Mixer)}
    if not limits:
        yield
        return
    if len(limits) > 1:
        raise ValueError(f"Mamba2 mixers with different step limits {sorted(limits)}")
    (low, high), = limits
    step = nemotron_h.mamba2_selective_state_update

    def floored(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                dt_softplus: bool = False, **kwargs: Any) -> torch.Tensor:
        if dt_bias is not None:  # as the step does, then the floor its batched scan applies
            dt = dt + dt_bias.to(dt.dtype)
        if dt_softplus:
            dt = F.softplus(dt)
        out: torch.Tensor = step(state, x, dt.clamp(min=low, max=high), A, B, C, D, dt_bias=None,
                                 dt_softplus=False, **kwargs)
        return out

    nemotron_h.mamba2_selective_state_update = floored
    try:
        yield
    finally:
        nemotron_h.mamba2_selective_state_update = step
