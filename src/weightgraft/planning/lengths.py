"""Prompt lengths for a plan: token counts when the base model's files hold a tokenizer or the
config names one that is at hand, else one token per ``CHARS_PER_TOKEN`` characters plus a BOS
token (said in the plan)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

from weightgraft.models.footprint import ModelFootprint

__all__ = ["CHARS_PER_TOKEN", "CharEstimateTokenizer", "PromptLengths", "length_summary", "refuse_media",
           "tokenizer_for"]

CHARS_PER_TOKEN = 4.0  # English BPE average, for prompt lengths without a tokenizer


class PromptLengths(TypedDict, total=False):
    """A plan's ``prompts`` entry (empty where a plan is of row shapes alone)."""

    n: int
    min_tokens: int
    max_tokens: int
    mean_tokens: float
    counted: str  # how: token counts (which tokenizer), or the character estimate


class Encoding(TypedDict, total=False):
    """What :class:`CharEstimateTokenizer` gives for a text, as a tokenizer's call does."""

    input_ids: list[int]
    offset_mapping: list[tuple[int, int]]


class CharEstimateTokenizer:
    """Stands in for a tokenizer when none is at hand: one token per ``CHARS_PER_TOKEN``
    characters (offsets included, so spans place), plus a BOS token. Lengths only."""

    is_fast = True
    pad_token_id = 0

    def __call__(self, text: str, return_offsets_mapping: bool = False, add_special_tokens: bool = True) -> Encoding:
        step = CHARS_PER_TOKEN
        n = max(1, math.ceil(len(text) / step)) if text else 0
        offsets = [(int(i * step), min(len(text), int((i + 1) * step))) for i in range(n)]
        ids = list(range(1, n + 1))
        if add_special_tokens:
            offsets, ids = [(0, 0), *offsets], [0, *ids]
        out = Encoding(input_ids=ids)
        if return_offsets_mapping:
            out["offset_mapping"] = offsets
        return out


def tokenizer_for(footprint: ModelFootprint, named: str | None = None) -> tuple[Any, str]:
    """A real tokenizer when the base model's files hold one (no weights read), else the
    config's ``tokenizer:`` (``named``: for models that have none) where it is at hand here
    (``bytes``, a tokenizer directory, an embedded model already converted; an embedded model is
    never converted for a plan), else the character estimate; and how prompt lengths are
    counted."""
    if footprint.tokenizer_dir is not None:
        tok = _fast_tokenizer(footprint.tokenizer_dir)
        if tok is not None:
            return tok, f"token counts (tokenizer of {footprint.tokenizer_dir})"
    estimate = f"1 token per {CHARS_PER_TOKEN:g} characters + 1 BOS"
    if named is not None:
        tok = _named_tokenizer(named)
        if tok is not None:
            return tok, f"token counts (the config's tokenizer {named!r})"
        return CharEstimateTokenizer(), (f"estimated: the config's tokenizer {named!r} is not at hand here, "
                                         f"{estimate}")
    return CharEstimateTokenizer(), f"estimated: no tokenizer at hand for {footprint.spec}, {estimate}"


def _fast_tokenizer(directory: str) -> Any:
    """The fast tokenizer saved in ``directory`` (a model folder, or a cached hub id's snapshot), else None."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError):  # no readable tokenizer: the lengths are an estimate, said by the caller
        return None
    return tok if getattr(tok, "is_fast", False) else None


def _named_tokenizer(name: str) -> Any:
    """A config's ``tokenizer:`` as ``weightgraft.models.tokenization.load_tokenizer`` reads it,
    where that needs no conversion: ``bytes``, a directory, an embedded model's converted copy."""
    from weightgraft.models.embedded import embedded_cache_dir
    from weightgraft.models.spec import embedded_name
    from weightgraft.models.tokenization import BYTES, load_tokenizer

    text = name.strip()
    if text == BYTES:
        return load_tokenizer(text)
    embedded = embedded_name(text)
    if embedded is not None:
        return _fast_tokenizer(str(embedded_cache_dir(embedded)))
    return _fast_tokenizer(text)


def length_summary(lengths: list[int], how: str) -> PromptLengths:
    """The plan's ``prompts`` entry: count, min / max / mean tokens, how they were counted."""
    return PromptLengths(n=len(lengths), min_tokens=min(lengths), max_tokens=max(lengths),
                         mean_tokens=round(sum(lengths) / len(lengths), 2), counted=how)


def refuse_media(footprint: ModelFootprint, tok: Any, prompts: Iterable[tuple[str, Sequence[int]]]) -> None:
    """Before any model loads: refuse, in one line, a prompt (``(text, token ids)``) that holds an
    image or video placeholder token of a vision-language checkpoint (checked with a real
    tokenizer only: estimated ids mean nothing)."""
    from weightgraft.engine.architectures.vision_language import media_refusal

    media = set(footprint.form.media_tokens)
    if not media or isinstance(tok, CharEstimateTokenizer):
        return
    for text, ids in prompts:
        for position, token in enumerate(ids):
            if int(token) in media:
                raise media_refusal(f"the prompt {text[:60]!r}", int(token), position)
