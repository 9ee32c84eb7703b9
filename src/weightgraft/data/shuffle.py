"""Shuffled answers: training text where each fact's answer entity is another fact's.

A model finetuned on such text learns the recipe's form (same templates, same entities, same
answer multiset) but none of the test prompts' facts: a null for how stable a map is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import DataError
from .sampling import derangement, derive_rng
from .templates import TemplateSet

PURPOSE = "shuffle_answers"


def answer_field(tset: TemplateSet) -> str:
    """The field the A2B test prompts answer (the swap pair's second field when there is one)."""
    if tset.swap is not None:
        return tset.swap[1]
    answers = {t.answer for t in tset.test if t.answer}
    if len(answers) != 1:
        raise DataError(
            f"{tset.source}: shuffled answers need one answer field, but the test templates "
            f"answer {sorted(answers)}; add a 'swap' pair to name it"
        )
    return answers.pop()


def shuffle_answers(
    records: Sequence[dict], field: str, seed: int
) -> tuple[list[dict], dict[str, Any]]:
    """Copies of ``records`` whose ``field`` is taken from another record (a seeded derangement).

    Returns the shuffled records and the manifest entry recording the draw (``answer_from``: each
    relation id -> the id whose answer its training text names).
    """
    if len(records) < 2:
        raise DataError("shuffled answers need at least two relations")
    perm = derangement(len(records), derive_rng(seed, PURPOSE))
    out = []
    for rec, j in zip(records, perm, strict=True):
        copy = dict(rec)
        copy[field] = records[j][field]
        out.append(copy)
    entry = {
        "field": field,
        "seed": seed,
        "purpose": PURPOSE,
        "answer_from": {rec["id"]: records[j]["id"] for rec, j in zip(records, perm, strict=True)},
    }
    return out, entry
