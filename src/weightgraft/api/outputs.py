"""What ``weightgraft.graft`` returns: next-token logits per prompt, readable top tokens, and
(on request) the logits at every position of the padded batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from weightgraft.schemes.protocol import DEFAULT_PROTOCOL


@dataclass(frozen=True)
class GraftOutput:
    """The grafted forward pass of a list of prompts.

    ``logits`` is ``[len(prompts), vocab]``: the next-token logits at each prompt's last token.
    ``full_logits`` is ``[batch, seq, vocab]`` over the padded batch (``input_ids``,
    ``attention_mask``; padded on the tokenizer's side) when asked for, else ``None``.
    ``source`` (``[batch, seq, n_slots]``, indices into the roles, base first) and
    ``head_source`` are the maps the pass ran: what was grafted where (``weightgraft.slots``
    names the slots), and the inputs of an equivalent ``weightgraft.graft_forward`` call.
    ``cache`` (when asked for) maps activation names to ``[batch, seq, ...]`` tensors over
    the padded batch: each slot's module output as the grafted pass computed it (``embed``,
    ``layers.{i}.q``, ``layers.{i}.o``, ``layers.{i}.down``, ``final_norm``, ...) and the
    residual stream after each layer, ``layers.{i}.resid_post``.
    """

    prompts: list[str]
    logits: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokenizer: Any
    source: torch.Tensor
    roles: list[str]
    head_source: dict[str, torch.Tensor] = field(default_factory=dict)
    full_logits: torch.Tensor | None = None
    cache: dict[str, torch.Tensor] | None = None
    protocol: str = DEFAULT_PROTOCOL  # what the rules were compiled under (README: protocols)

    def top(self, k: int = 5) -> list[list[tuple[str, float]]]:
        """Per prompt, the ``k`` most probable next tokens as (decoded token, probability)."""
        if k < 1:
            raise ValueError("k must be at least 1")
        probs = torch.softmax(self.logits.detach().float(), dim=-1)
        values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
        return [
            [(self.tokenizer.decode([int(i)]), float(p)) for i, p in zip(row_ids, row_p, strict=True)]
            for row_ids, row_p in zip(ids.tolist(), values.tolist(), strict=True)
        ]

    def top_frame(self, k: int = 5) -> pd.DataFrame:
        """``top(k)`` as a tidy table, one row per (prompt, rank): columns ``prompt_index``,
        ``prompt`` (its text, as in ``wg.compare``'s rows), ``rank`` (0 = likeliest, the
        convention of a run's ``rank`` column), ``token``, ``token_id`` and ``probability``."""
        if k < 1:
            raise ValueError("k must be at least 1")
        probs = torch.softmax(self.logits.detach().float(), dim=-1)
        values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
        rows = [
            {"prompt_index": b, "prompt": self.prompts[b], "rank": r, "token": self.tokenizer.decode([int(i)]),
             "token_id": int(i), "probability": float(p)}
            for b, (row_ids, row_p) in enumerate(zip(ids.tolist(), values.tolist(), strict=True))
            for r, (i, p) in enumerate(zip(row_ids, row_p, strict=True))
        ]
        return pd.DataFrame(rows, columns=["prompt_index", "prompt", "rank", "token", "token_id", "probability"])

    def __repr__(self) -> str:
        full = "" if self.full_logits is None else f", full_logits={list(self.full_logits.shape)}"
        cache = "" if self.cache is None else f", cache={len(self.cache)} activations"
        n = len(self.prompts)
        return (f"GraftOutput({n} prompt{'' if n == 1 else 's'}, protocol={self.protocol}, "
                f"logits={list(self.logits.shape)}{full}{cache})")
