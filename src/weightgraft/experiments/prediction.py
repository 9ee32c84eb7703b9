"""What a prediction is scored on: the fewest answer tokens that decode to whole characters.
Every metric itself (rank, top-k, log-probabilities, logit difference, KL) lives in
``weightgraft.engine.metric_table``; its prediction helpers are re-exported here for callers."""

from __future__ import annotations

from collections.abc import Sequence

from weightgraft.engine.metric_table import TOP_K, Prediction, answer_logprob, score_next_token

__all__ = ["TOP_K", "Prediction", "answer_logprob", "score_next_token", "whole_character_prefix"]


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
