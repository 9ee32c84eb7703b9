"""Attention parts with a forward of their own in the one batched pass: gpt-oss's attention sinks
(``sinks.py``), which the attention function reads, not a module call."""

from weightgraft.engine.attention.sinks import swap_sinks

__all__ = ["swap_sinks"]
