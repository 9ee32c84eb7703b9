"""Test prompts as scored examples, with a label per token position that lines positions up
across prompts of one template (entities differ in length, the template's words do not); the
labels are ``schemes.labels.position_labels``, each a position selector of its own token."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from weightgraft.data.prompts import DatasetError, TestPrompt, answer_token_ids
from weightgraft.engine.cells import ScoredExample
from weightgraft.schemes.labels import position_labels


@dataclass(frozen=True)
class LocalizeExample:
    """One prompt: what is scored (first answer token after the last prompt token) and the
    label of each position."""

    prompt: TestPrompt
    scored: ScoredExample
    labels: tuple[str, ...]  # one per position 0..scored.position


def build_examples(prompts: Sequence[TestPrompt], tokenizer: Any) -> tuple[list[LocalizeExample], list[dict[str, str]]]:
    """Scored examples and the prompts left out (with the reason: never silently). Each carries
    the first tokens of the other answers among ``prompts`` of its template and answer field
    (those unlike its own first token): what ``fact_logprob`` contrasts its answer with."""
    if not getattr(tokenizer, "is_fast", False):
        raise DatasetError("position labels need a fast tokenizer (offset mapping)")
    out, excluded = [], []
    for p in prompts:
        enc = tokenizer(p.prompt, return_offsets_mapping=True, add_special_tokens=True)
        answer = answer_token_ids(tokenizer, p.answer)
        if not answer:
            excluded.append({"example_id": p.id, "template": p.template, "reason": "answer tokenizes to nothing"})
            continue
        ids = list(enc["input_ids"])
        labels = position_labels(enc["offset_mapping"], p.spans, p.answer_field)
        scored = ScoredExample(tuple(ids), position=len(ids) - 1, target=int(answer[0]))
        out.append(LocalizeExample(p, scored, tuple(labels)))
    firsts: dict[tuple[str, str | None], dict[int, None]] = defaultdict(dict)
    for e in out:
        firsts[(e.prompt.template, e.prompt.answer_field)][e.scored.target] = None
    return [LocalizeExample(e.prompt, replace(e.scored, other_answers=tuple(
        t for t in firsts[(e.prompt.template, e.prompt.answer_field)] if t != e.scored.target)), e.labels)
        for e in out], excluded
