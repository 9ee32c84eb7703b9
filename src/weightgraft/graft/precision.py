"""Half precision without batch dependence: every model runs HF's eager attention."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

HALF_DTYPES = frozenset({torch.bfloat16, torch.float16})


def is_half(model: Any) -> bool:
    """Whether the model's floating-point parameters are bfloat16 or float16."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype in HALF_DTYPES
    return False


def batch_invariant_attention(models: Iterable[Any]) -> None:
    """Switch half-precision models to HF's eager attention, in place.

    HF's SDPA (and flash) kernels round a padded row differently from the same row alone (on
    SmolLM2 in bfloat16: up to 0.55 logits at a real position; ~27 logits at a padded one), so
    a prompt's numbers would depend on which other prompts share its batch. Eager attention
    gives each row the same numbers in any batch. float32 and float64 models are left alone.
    """
    for model in models:
        if not is_half(model):
            continue
        for module in model.modules():
            cfg = getattr(module, "config", None)
            if cfg is not None and hasattr(cfg, "_attn_implementation"):
                cfg._attn_implementation = "eager"
