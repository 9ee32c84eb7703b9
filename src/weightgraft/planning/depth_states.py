"""The bytes depth sharing holds in shared states, from a model's config alone: what a plan
adds to the peak of exact effects (``weightgraft.planning.localize``) and what
``DepthStats.peak_bytes`` measures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import DynamicCache

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["cached_positions", "depth_state_bytes", "latent_cache_width"]


def latent_cache_width(text: Any) -> int | None:
    """Elements one multi-head latent attention layer (DeepSeek-V3 / V2) caches per position, None
    for other attention: a grafted pass caches each position's keys and values as its ``kv_b``
    decompressed them (``weightgraft.engine.attention.latent``), per query head a key of
    ``qk_nope_head_dim + qk_rope_head_dim`` and a value of ``v_head_dim``, not the latent, so its
    keys and values are not ``2 x kv_heads x head_dim``."""
    if not getattr(text, "kv_lora_rank", None) or getattr(text, "qk_nope_head_dim", None) is None:
        return None
    parts = (getattr(text, n) for n in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    return int(text.num_attention_heads) * sum(int(p) for p in parts)


def cached_positions(config: PretrainedConfig, seq_len: int) -> list[int]:
    """Per decoder layer, the positions a pass's ``DynamicCache`` keeps of a row of ``seq_len``
    tokens: all of them, or a sliding-window layer's last ``window - 1`` (the cache transformers
    builds from ``config``, as ``depth_forward`` builds it)."""
    out = []
    for layer in DynamicCache(config=config).layers:
        window = getattr(layer, "sliding_window", None)
        out.append(seq_len if window is None else min(seq_len, int(window) - 1))
    return out


def depth_state_bytes(
    config: PretrainedConfig, n_references: int, seq_len: int, chunk: int, dtype_bytes: int = 4,
) -> int:
    """The bytes ``depth_forward`` holds at most in shared states (``DepthStats.peak_bytes``):
    ``n_references`` reference rows of at most ``seq_len`` tokens, each with its keys, values and
    residual stream at every layer (a full cache: items need any prefix of the row), and one
    pass of ``chunk`` rows spanning ``seq_len`` positions (cached and their own: rows of one first
    position do), with its cache rows (a sliding-window layer keeps its window) and the residuals
    put in.

    ``n_references`` counts the rows items actually start from: ``exact_effects`` shares with
    each prompt's base, and with the union of the prompt's sets where some set shares more with
    it (a set without one cell, in refinement): single-cell maps use the bases alone. A pass may
    hold fewer than ``chunk`` rows (``cost_batches`` cuts a pass padded past ``SLACK``), and a
    pass mixing first positions spans a few positions more."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv = latent_cache_width(text) or 2 * kv_heads * head_dim
    references = n_references * layers * seq_len * (kv + hidden)
    passes = chunk * (kv * sum(cached_positions(config, seq_len)) + seq_len * hidden)
    return dtype_bytes * (references + passes)
