"""Metrics of one prediction: the answer's rank, probability and top-k hits at the next token,
log-probabilities of its first token and of the whole answer, the logit difference to a
distractor and the KL divergence from the donor's distribution."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TOP_K: tuple[int, ...] = (1, 5, 10, 20, 50, 100)
N_TOP_TOKENS = 20


@dataclass(frozen=True)
class Prediction:
    """Metrics of the next-token distribution at the last prompt token."""

    target_token_id: int
    rank: int  # 0-based: how many tokens are strictly more probable than the target
    prob: float
    hits: dict[int, bool]
    top_ids: list[int]
    top_probs: list[float]
    finite: bool


def score_next_token(logits: torch.Tensor, target: int) -> Prediction:
    """Rank, probability and top-k hits of ``target`` under ``logits`` ([vocab])."""
    logits = logits.float()
    finite = bool(torch.isfinite(logits).all())
    if not finite:
        return Prediction(target, -1, float("nan"), {k: False for k in TOP_K}, [], [], False)
    probs = torch.softmax(logits, dim=-1)
    rank = int((logits > logits[target]).sum())
    top = torch.topk(probs, k=min(N_TOP_TOKENS, probs.numel()))
    return Prediction(
        target_token_id=target,
        rank=rank,
        prob=float(probs[target]),
        hits={k: rank < k for k in TOP_K},
        top_ids=top.indices.tolist(),
        top_probs=top.values.tolist(),
        finite=True,
    )


def answer_logprob(logits: torch.Tensor, answer_ids: Sequence[int]) -> float:
    """Sum of log-probabilities of every answer token, teacher-forced.

    ``logits`` are ``[len(answer_ids), vocab]``: row i predicts ``answer_ids[i]``.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(list(answer_ids), device=logits.device)
    return float(logp[torch.arange(len(idx), device=logits.device), idx].sum())


def logit_difference(logits: torch.Tensor, answer: int, distractor: int | None) -> float:
    """Answer logit minus distractor logit (first tokens); NaN without a distractor."""
    if distractor is None:
        return float("nan")
    logits = logits.float()
    return float(logits[answer] - logits[distractor])


def kl_divergence(donor_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(donor || grafted) in nats of two next-token distributions given as logits."""
    p = torch.log_softmax(donor_logits.double(), dim=-1)
    q = torch.log_softmax(logits.double(), dim=-1)
    return float((p.exp() * (p - q)).sum())


def first_token_logprob(logits: torch.Tensor, target: int) -> float:
    """Log-probability of the answer's first token (the token top-k is scored on)."""
    return float(torch.log_softmax(logits.double(), dim=-1)[target])


def whole_character_prefix(tokenizer: object, answer_ids: Sequence[int]) -> int:
    """Fewest leading answer tokens that decode to whole characters.

    1 for most answers; more where the first token is a bare UTF-8 byte (Cyrillic, Greek, CJK
    names in byte-level BPE vocabularies), which many answers share, so its rank alone does
    not identify the answer.
    """
    for k in range(1, len(answer_ids) + 1):
        if "\ufffd" not in tokenizer.decode(list(answer_ids[:k])):  # type: ignore[attr-defined]
            return k
    return len(answer_ids)
