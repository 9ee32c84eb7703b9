"""Prompt lengths for a plan: token counts when the base model's files hold a tokenizer,
else one token per ``CHARS_PER_TOKEN`` characters plus a BOS token (said in the plan)."""

from __future__ import annotations

import math
from typing import Any

from weightgraft.models.footprint import ModelFootprint

__all__ = ["CHARS_PER_TOKEN", "CharEstimateTokenizer", "length_summary", "tokenizer_for"]

CHARS_PER_TOKEN = 4.0  # English BPE average, for prompt lengths without a tokenizer


class CharEstimateTokenizer:
    """Stands in for a tokenizer when none is at hand: one token per ``CHARS_PER_TOKEN``
    characters (offsets included, so spans place), plus a BOS token. Lengths only."""

    is_fast = True
    pad_token_id = 0

    def __call__(self, text: str, return_offsets_mapping: bool = False, add_special_tokens: bool = True) -> dict[str, Any]:
        step = CHARS_PER_TOKEN
        n = max(1, math.ceil(len(text) / step)) if text else 0
        offsets = [(int(i * step), min(len(text), int((i + 1) * step))) for i in range(n)]
        ids = list(range(1, n + 1))
        if add_special_tokens:
            offsets, ids = [(0, 0), *offsets], [0, *ids]
        out: dict[str, Any] = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = offsets
        return out


def tokenizer_for(footprint: ModelFootprint) -> tuple[Any, str]:
    """A real tokenizer when the base model's files hold one (no weights read), else the
    character estimate; and how prompt lengths are counted."""
    if footprint.tokenizer_dir is not None:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(footprint.tokenizer_dir, local_files_only=True)
            if getattr(tok, "is_fast", False):
                return tok, f"token counts (tokenizer of {footprint.tokenizer_dir})"
        except Exception:  # an unreadable tokenizer only makes the lengths an estimate, said below
            pass
    return CharEstimateTokenizer(), (f"estimated: no tokenizer at hand for {footprint.spec}, "
                                     f"1 token per {CHARS_PER_TOKEN:g} characters + 1 BOS")


def length_summary(lengths: list[int], how: str) -> dict[str, Any]:
    """The plan's ``prompts`` entry: count, min / max / mean tokens, how they were counted."""
    return {"n": len(lengths), "min_tokens": min(lengths), "max_tokens": max(lengths),
            "mean_tokens": round(sum(lengths) / len(lengths), 2), "counted": how}
