"""Multi-head latent attention (DeepSeek-V3 / V2) with keys and values cached at their own positions.

MLA computes, per position, a latent (``kv_a`` then ``kv_a_norm``) and a shared rotary key, and
decompresses the latent into per-head keys and values with ``kv_b``. transformers caches the
latent and applies ``kv_b`` to every cached latent at each step (``expand_kv``): stepped through
that cache, a key's ``kv_b`` would be the *query's* model's. By the definition weightgraft grafts,
the weights applied to a key or value are its own position's model's, as ``k_proj`` and ``v_proj``
are in ordinary attention: ``kv_a``, ``kv_a_norm`` and ``kv_b`` of the key's position, ``q_a`` /
``q_a_norm`` / ``q_b`` (or ``q``) of the query's. The one batched pass computes exactly that (it
decompresses every position's latent at once, each row by its own model); with a cache, this
module makes the cache hold what ``kv_b`` made of each position's latent when that position was
computed, so a pass continued from a cache (the per-token reference, prefix and depth sharing,
generation) is the same definition.

The attention module's own forward runs unchanged, except that the cache it sees keeps nothing
(its latents are the new positions' only) and its ``expand_kv`` decompresses them, then adds the
keys and values to the real cache and returns all of them. Such a cache holds ``[batch, heads,
seq, qk_head_dim]`` keys and ``[..., v_head_dim]`` values, as ordinary attention's does (more bytes
than the latent); a cache of latents, filled by the model's own forward, is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from transformers.cache_utils import Cache

from weightgraft.engine.architectures import Slot
from weightgraft.engine.source_map import SlotName
from weightgraft.engine.swaps import Swaps, own_forward
from weightgraft.errors import GraftArgumentError

__all__ = ["decompressed_forward", "latent_attention_paths", "swap_latent_caches"]


class _NewPositionsOnly:
    """The cache the attention module's forward sees: it keeps nothing, so its ``expand_kv`` gets the
    new positions' latents alone (the real cache is updated there, after decompression)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return key_states, value_states


_NEW_ONLY = _NewPositionsOnly()


def latent_attention_paths(slot_list: list[Slot]) -> list[str]:
    """The attention modules of a model's MLA layers: those that hold its ``kv_b`` slots."""
    return [slot.parts[0].path.rpartition(".")[0] for slot in slot_list
            if SlotName.parse(slot.name).component == "kv_b"]


def _refuse_latents(cache: Cache, module: nn.Module) -> None:
    """A cache filled by the model's own forward holds latents: continuing it would decompress earlier
    positions with the current weights, so it is refused rather than mixed."""
    layers = getattr(cache, "layers", None)
    idx = int(module.layer_idx)  # type: ignore[arg-type]  # an int attribute nn.Module's stubs type as Tensor | Module
    keys = getattr(layers[idx], "keys", None) if layers is not None and idx < len(layers) else None
    want = (int(module.num_heads), int(module.qk_head_dim))  # type: ignore[arg-type]
    if isinstance(keys, torch.Tensor) and keys.numel() and (keys.shape[1], keys.shape[-1]) != want:
        raise GraftArgumentError(
            f"layer {idx}'s cache holds {tuple(keys.shape)} keys, not the decompressed [batch, {want[0]}, seq, {want[1]}] "
            "a grafted pass caches for multi-head latent attention (a cache of latents, filled by the model's own "
            "forward?): start from the prompt, or continue a cache a grafted pass filled")


def decompressed_forward(module: nn.Module) -> Callable[..., Any]:
    """A forward for an MLA attention module whose cache holds each position's keys and values as
    ``kv_b`` made them at that position; without a cache, the module's own forward."""
    own = own_forward(module)

    def forward(*args: Any, **kwargs: Any) -> Any:
        positional = len(args) > 3  # (hidden_states, position_embeddings, attention_mask, past_key_values)
        cache = args[3] if positional else kwargs.get("past_key_values")
        if cache is None:  # nothing cached: every position's latent is decompressed by its own row's kv_b
            return own(*args, **kwargs)
        _refuse_latents(cache, module)
        expand = cast(Callable[..., tuple[torch.Tensor, torch.Tensor]], module.expand_kv)  # the module's own

        def expand_and_cache(kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = expand(kv_nope, k_rot)  # the new positions, by the kv_b serving them
            cached: tuple[torch.Tensor, torch.Tensor] = cache.update(keys, values, module.layer_idx)
            return cached

        had = module.__dict__.get("expand_kv")
        module.__dict__["expand_kv"] = expand_and_cache
        try:
            if positional:
                return own(*args[:3], _NEW_ONLY, *args[4:], **kwargs)
            return own(*args, **{**kwargs, "past_key_values": _NEW_ONLY})
        finally:
            if had is None:
                del module.__dict__["expand_kv"]
            else:
                module.__dict__["expand_kv"] = had

    return forward


def swap_latent_caches(swap: Swaps, base: nn.Module, slot_list: list[Slot]) -> None:
    """For one pass, every MLA attention module of ``base`` caches decompressed keys and values."""
    for path in latent_attention_paths(slot_list):
        module = base.get_submodule(path)
        swap.forward(module, decompressed_forward(module))
