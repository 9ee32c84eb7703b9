"""Scoring a batch of (example, scheme) items: one grafted forward pass, then one metrics row
per item (the rows ``results.parquet`` holds; ``weightgraft.compare`` returns the same)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from weightgraft.experiments.examples import Prepared
from weightgraft.experiments.metrics import TOP_K, answer_logprob, score_next_token, whole_character_prefix
from weightgraft.graft.prefix import GraftItem, prefix_forward


def compute_logits(models: Sequence[Any], chunk: Sequence[tuple[Prepared, str]], pad_id: int, score_answer: bool = True, share: bool = True) -> tuple[torch.Tensor, list[int]]:
    """Logits at the scored positions of one batch of (example, scheme) items."""
    items, n_logits = _graft_items(chunk, score_answer)
    logits = prefix_forward(models, items, pad_id, share=share)
    return logits.float().cpu(), n_logits


def _graft_items(chunk, score_answer: bool) -> tuple[list[GraftItem], list[int]]:
    """The batch as ``prefix_forward`` items: answer tokens after the prompt take the last
    prompt token's weights; logits from the last prompt token on."""
    items, n_logits = [], []
    for ex, scheme in chunk:
        extra = ex.answer_ids[:-1] if score_answer else []
        heads = {name: _extend(h, len(extra)) for name, h in ex.heads.get(scheme, {}).items()}
        items.append(GraftItem(
            input_ids=ex.input_ids + extra, source=_extend(ex.sources[scheme], len(extra)),
            head_source=heads or None, logit_start=len(ex.input_ids) - 1, n_logits=1 + len(extra),
        ))
        n_logits.append(1 + len(extra))
    return items, n_logits


def _extend(src: torch.Tensor, n: int) -> torch.Tensor:
    """Continuation positions (answer tokens) take the last prompt token's weights."""
    return torch.cat([src, src[-1:].expand(n, *src.shape[1:])], dim=0) if n else src


def score_rows(items, logits, n_logits, tokenizer, model_set, scheme_meta) -> list[dict[str, Any]]:
    rows = []
    for b, (ex, scheme) in enumerate(items):
        p = ex.prompt
        pred = score_next_token(logits[b, 0], ex.answer_ids[0])
        row = {
            "model_set": model_set, "template": p.template, "scheme": scheme,
            "family": scheme_meta[scheme]["family"], "labels": scheme_meta[scheme]["labels"],
            "example_id": p.id, "relation_id": p.relation_id, "prompt": p.prompt, "answer": p.answer,
            "target_token_id": pred.target_token_id, "target_token": tokenizer.decode([pred.target_token_id]),
            "rank": pred.rank, "prob": pred.prob,
            "answer_logprob": answer_logprob(logits[b, : n_logits[b]], ex.answer_ids[: n_logits[b]])
            if pred.finite else float("nan"),
            "n_answer_tokens": n_logits[b],
            **{f"top{k}": pred.hits[k] for k in TOP_K},
            "top_tokens": [tokenizer.decode([i]) for i in pred.top_ids],
            "top_probs": pred.top_probs, "finite": pred.finite,
            **_first_character(tokenizer, ex.answer_ids, logits[b, : n_logits[b]], pred.finite),
        }
        rows.append(row)
    return rows


def _first_character(tokenizer, answer_ids, logits, finite: bool) -> dict[str, Any]:
    """``target_partial``: the scored first token is a piece of a character (flagged, counted);
    ``first_character_logprob``: log-probability of the tokens that make the first whole
    character (needs ``score_answer``; NaN otherwise), a target that identifies the answer."""
    n = whole_character_prefix(tokenizer, answer_ids)
    ok = finite and n <= logits.shape[0]
    return {"target_partial": n > 1,
            "first_character_logprob": answer_logprob(logits[:n], answer_ids[:n]) if ok else float("nan")}
