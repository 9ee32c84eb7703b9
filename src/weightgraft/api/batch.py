"""A notebook's prompts as one engine batch: each prompt tokenized and mapped on its own
(``PreparedGraft.encode``, so positions are located on each prompt's own tokens), then padded
on the tokenizer's side with padding served by the base (it is masked out, so it never matters)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from weightgraft.schemes.binding import Encoded


@dataclass(frozen=True)
class Batch:
    """Engine inputs for a list of prompts; ``last`` is each row's last real token."""

    input_ids: torch.Tensor  # [batch, seq]
    attention_mask: torch.Tensor  # [batch, seq]
    source: torch.Tensor  # [batch, seq, n_slots]
    head_source: dict[str, torch.Tensor]  # slot name -> [batch, seq, heads]
    last: torch.Tensor  # [batch]


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
