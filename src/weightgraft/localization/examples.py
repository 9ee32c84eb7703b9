"""Test prompts as scored examples, with a label per token position that lines positions up
across prompts of one template (entities differ in length, the template's words do not)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weightgraft.data.freeform import load_prompts
from weightgraft.data.prompts import DatasetError, TestPrompt, answer_token_ids
from weightgraft.schemes.selectors import first_entity, token_span
from weightgraft.engine.cells import ScoredExample


@dataclass(frozen=True)
class LocalizeExample:
    """One prompt: what is scored (first answer token after the last prompt token) and the
    label of each position."""

    prompt: TestPrompt
    scored: ScoredExample
    labels: tuple[str, ...]  # one per position 0..scored.position


def position_labels(offsets: Sequence[tuple[int, int]], spans: Mapping[str, tuple[int, int]],
                    answer_field: str | None = None) -> list[str]:
    """``last`` for the last token; inside a span, ``{span}`` for its last token and
    ``{span}-k`` for k tokens before it; after a span, ``{span}+k``; before any span, ``tok{i}``.
    The first entity span is also named ``first_entity`` (``first_entity`` = its last token)."""
    n = len(offsets)
    fe = first_entity(spans, answer_field)
    owner: dict[int, tuple[str, int]] = {}
    for name, (start, end) in spans.items():
        toks = token_span(offsets, start, end)
        shown = "first_entity" if name == fe else name
        for k, i in enumerate(reversed(toks)):
            owner.setdefault(i, (shown, k))
    labels, last_span, since = [], None, 0
    for i in range(n):
        if i in owner:
            name, k = owner[i]
            labels.append(name if k == 0 else f"{name}-{k}")
            if k == 0:
                last_span, since = name, 0
        elif last_span is not None:
            since += 1
            labels.append(f"{last_span}+{since}")
        else:
            labels.append(f"tok{i}")
    labels[-1] = "last"
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # overlapping spans could repeat a label: keep them apart
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label}#{seen[label]}"
    return labels


def build_examples(prompts: Sequence[TestPrompt], tokenizer: Any) -> tuple[list[LocalizeExample], list[dict[str, str]]]:
    """Scored examples and the prompts left out (with the reason: never silently)."""
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
    return out, excluded


def select_prompts(config: Any) -> list[TestPrompt]:
    """The config's test prompts (a dataset folder or a free-form JSONL, as ``run`` reads them)
    after its template, direction and per-template limit filters; an error when a named
    template is missing or nothing is left. Without ``directions``, the trained direction
    (``localize.directions``); prompts that carry no direction are kept then."""
    from weightgraft.localization.directions import choose_directions

    prompts = load_prompts(config.data)
    directions = choose_directions(config).directions
    strict = config.directions is not None
    present = {p.template for p in prompts}
    if config.templates is not None:
        missing = [t for t in config.templates if t not in present]
        if missing:
            raise DatasetError(f"templates {missing} are not in the dataset (it has {sorted(present)})")
    chosen, per_template = [], defaultdict(int)
    for p in prompts:
        if config.templates is not None and p.template not in config.templates:
            continue
        if directions is not None and p.direction not in directions and (strict or p.direction is not None):
            continue
        if config.limit is not None and per_template[p.template] >= config.limit:
            continue
        per_template[p.template] += 1
        chosen.append(p)
    if not chosen:
        raise DatasetError("no test prompt is left after the template/direction filters")
    return chosen
