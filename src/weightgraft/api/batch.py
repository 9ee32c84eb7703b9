"""A notebook's prompts as one engine batch: tokenized one by one (so positions are located on
each prompt's own tokens), source maps compiled per prompt, then padded on the tokenizer's side
with padding served by the base (it is masked out, so it never matters)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from weightgraft.api.inputs import GraftInputError
from weightgraft.schemes.scheme import CompiledScheme
from weightgraft.schemes.selectors import SpanNotFound


@dataclass(frozen=True)
class Batch:
    """Engine inputs for a list of prompts; ``last`` is each row's last real token."""

    input_ids: torch.Tensor  # [batch, seq]
    attention_mask: torch.Tensor  # [batch, seq]
    source: torch.Tensor  # [batch, seq, n_slots]
    head_source: dict[str, torch.Tensor]  # slot name -> [batch, seq, heads]
    last: torch.Tensor  # [batch]


@dataclass(frozen=True)
class Encoded:
    """One prompt's tokens and its compiled source map."""

    input_ids: list[int]
    source: torch.Tensor  # [n_tokens, n_slots]
    heads: dict[str, torch.Tensor]  # slot name -> [n_tokens, heads]


def encode(
    tokenizer: Any, prompts: Sequence[str], spans: Sequence[Mapping[str, tuple[int, int]]],
    compiled: CompiledScheme,
) -> list[Encoded]:
    """Tokens and source map of every prompt; a rule that selects no token of a prompt (or a
    span it lacks) is an error naming that prompt, never a silently ungrafted row."""
    out = []
    for i, (prompt, prompt_spans) in enumerate(zip(prompts, spans, strict=True)):
        enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
        if not enc["input_ids"]:
            raise GraftInputError(f"prompt {i} ({prompt!r}) tokenizes to nothing")
        try:
            source, heads = compiled.sources(enc["offset_mapping"], prompt_spans)
        except SpanNotFound as exc:
            hint = (" (wg.tokens(tokenizer, prompt, spans) shows its tokens and their labels)" if prompt_spans
                    else " (pass spans=[{name: substring or (start, end)}, ...])")
            raise GraftInputError(f"prompt {i} ({prompt!r}): {exc}{hint}") from exc
        out.append(Encoded(list(enc["input_ids"]), source, heads))
    return out


def pad(encoded: Sequence[Encoded], pad_id: int, left: bool, seq: int | None = None) -> Batch:
    """Stack prompts into one batch, padded on the left or the right to ``seq`` tokens."""
    seq = seq or max(len(e.input_ids) for e in encoded)
    batch, n_slots = len(encoded), encoded[0].source.shape[1]
    ids = torch.full((batch, seq), pad_id, dtype=torch.long)
    mask = torch.zeros(batch, seq, dtype=torch.long)
    source = torch.zeros(batch, seq, n_slots, dtype=torch.long)
    widths = {name: h.shape[1] for e in encoded for name, h in e.heads.items()}
    heads = {name: torch.zeros(batch, seq, w, dtype=torch.long) for name, w in widths.items()}
    last = torch.empty(batch, dtype=torch.long)
    for b, e in enumerate(encoded):
        n = len(e.input_ids)
        span = slice(seq - n, seq) if left else slice(0, n)
        ids[b, span] = torch.tensor(e.input_ids)
        mask[b, span] = 1
        source[b, span] = e.source
        last[b] = seq - 1 if left else n - 1
        for name, h in e.heads.items():  # one scheme: every prompt maps the same slots
            heads[name][b, span] = h
    return Batch(ids, mask, source, heads, last)
