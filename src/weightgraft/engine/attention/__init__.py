"""Attention parts with a forward of their own in the one batched pass: gpt-oss's attention sinks
(``sinks.py``), which the attention function reads, not a module call; multi-head latent
attention's cache of keys and values decompressed at their own positions (``latent.py``)."""

from weightgraft.engine.attention.latent import decompressed_forward, latent_attention_paths, swap_latent_caches
from weightgraft.engine.attention.sinks import swap_sinks

__all__ = ["decompressed_forward", "latent_attention_paths", "swap_latent_caches", "swap_sinks"]
