"""From test prompts to grafting items: filtering, tokenizing, locating spans, one source map
per scheme.

The rule for spans: a scheme that names a span which no prompt of a template has (the movie
title in the headline) does not run on that template, and the skip is reported; an example
whose template has the span but that example lacks it (or any other placement failure) is
excluded from every scheme, counted with the reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from weightgraft.data.prompts import DatasetError, TestPrompt, answer_token_ids
from weightgraft.experiments.config import ExperimentConfig
from weightgraft.schemes.scheme import CompiledScheme
from weightgraft.schemes.selectors import SpanNotFound


def select_prompts(prompts: list[TestPrompt], config: ExperimentConfig) -> list[TestPrompt]:
    """The run's prompts: every pipeline's selection (``RunInputs.select``) with the config's groups."""
    return config.select(prompts, config.directions, config.groups)


@dataclass
class Prepared:
    """A tokenized example with one source map per scheme."""

    prompt: TestPrompt
    input_ids: list[int]
    answer_ids: list[int]
    sources: dict[str, torch.Tensor]
    heads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # per-head schemes
    # first tokens of the other answers of its template and answer field, unlike its own (fact_logprob)
    other_answers: tuple[int, ...] = ()


@dataclass
class Exclusions:
    """Examples left out of every scheme of a comparison, with the reason (never silent)."""

    rows: list[dict[str, str]] = field(default_factory=list)
    # (model set, template, scheme) -> the span the template never has
    skipped: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def add(self, model_set: str, prompt: TestPrompt, reason: str) -> None:
        self.rows.append({"model_set": model_set, "template": prompt.template, "example_id": prompt.id, "reason": reason})

    def skip(self, model_set: str, template: str, scheme: str, span: str) -> None:
        self.skipped[(model_set, template, scheme)] = span

    def summary(self) -> dict[str, Any]:
        by_reason = Counter(r["reason"].split(":")[0] for r in self.rows)
        skipped = [{"model_set": m, "template": t, "scheme": s, "span": span}
                   for (m, t, s), span in self.skipped.items()]
        return {"total": len(self.rows), "by_reason": dict(by_reason), "examples": self.rows,
                "skipped_schemes": skipped}


def prepare(
    prompts: Sequence[TestPrompt], tokenizer: Any, compiled: Sequence[CompiledScheme],
    model_set: str, exclusions: Exclusions, world: Sequence[TestPrompt] | None = None,
) -> list[Prepared]:
    """Tokenize each prompt, locate spans, build every scheme's source. A scheme whose span
    the prompt's template never has is skipped for that template; an example any other scheme
    cannot place is excluded from all of them. ``world``: every prompt of the dataset, whose
    answers (same template and answer field) are each prompt's ``other_answers``, so a row does
    not depend on which prompts a run selects (default: ``prompts``)."""
    if not getattr(tokenizer, "is_fast", False):
        raise DatasetError("span location needs a fast tokenizer (offset mapping); this one is slow")
    template_spans = spans_by_template(prompts)
    out = []
    for p in prompts:
        enc = tokenizer(p.prompt, return_offsets_mapping=True, add_special_tokens=True)
        answer_ids = answer_token_ids(tokenizer, p.answer)
        if not answer_ids:
            exclusions.add(model_set, p, f"answer tokenizes to nothing: {p.answer!r}")
            continue
        both = {}
        try:
            for c in compiled:
                try:
                    both[c.name] = c.sources(enc["offset_mapping"], p.spans, p.answer_field)
                except SpanNotFound as exc:
                    if exc.span is None or exc.span in template_spans[p.template]:
                        raise
                    exclusions.skip(model_set, p.template, c.name, exc.span)
        except SpanNotFound as exc:
            exclusions.add(model_set, p, f"span not found: {exc}")
            continue
        sources = {name: src for name, (src, _) in both.items()}
        heads = {name: h for name, (_, h) in both.items() if h}
        out.append(Prepared(p, list(enc["input_ids"]), list(answer_ids), sources, heads))
    firsts: dict[tuple[str, str | None], dict[int, None]] = {}
    for p in world if world is not None else prompts:
        ids = answer_token_ids(tokenizer, p.answer)
        if ids:
            firsts.setdefault((p.template, p.answer_field), {})[ids[0]] = None
    for ex in out:
        ex.other_answers = tuple(t for t in firsts[(ex.prompt.template, ex.prompt.answer_field)] if t != ex.answer_ids[0])
    return out


def spans_by_template(prompts: Sequence[TestPrompt]) -> dict[str, set[str]]:
    """Template -> every span name some prompt of it marks."""
    out: dict[str, set[str]] = {}
    for p in prompts:
        out.setdefault(p.template, set()).update(p.spans)
    return out


def served_experts(prepared: Sequence[Prepared], slot_names: Sequence[str], banks: Sequence[str]) -> dict[int, dict[str, frozenset[int]]]:
    """Model index -> expert bank -> the experts it serves, for the banks a model serves only
    expert by expert (a rule's ``experts``): a lean donor holds those experts' slices alone. A
    bank some scheme takes whole from the model is left out (the donor holds it whole)."""
    index = {name: i for i, name in enumerate(slot_names)}
    whole: dict[int, set[str]] = {}
    some: dict[int, dict[str, set[int]]] = {}
    for ex in prepared:
        for key, src in ex.sources.items():
            maps = ex.heads.get(key, {})
            for bank in banks:
                if bank in maps:
                    for m in maps[bank].unique().tolist():
                        chosen = (maps[bank] == m).any(dim=0).nonzero().flatten().tolist()
                        some.setdefault(m, {}).setdefault(bank, set()).update(chosen)
                else:
                    for m in src[:, index[bank]].unique().tolist():
                        whole.setdefault(m, set()).add(bank)
    return {m: {b: frozenset(e) for b, e in per.items() if b not in whole.get(m, set())} for m, per in some.items()}


def served_slots(prepared: Sequence[Prepared], slot_names: Sequence[str]) -> dict[int, set[str]]:
    """Model index -> the slots it serves somewhere in the sweep (what a donor must hold)."""
    hits: dict[int, torch.Tensor] = {}
    for ex in prepared:
        for src in ex.sources.values():
            for m in src.unique().tolist():
                row = (src == m).any(dim=0)
                hits[m] = hits[m] | row if m in hits else row
    out = {m: {slot_names[i] for i in row.nonzero().flatten().tolist()} for m, row in hits.items()}
    for ex in prepared:
        for head_maps in ex.heads.values():
            for name, h in head_maps.items():
                for m in h.unique().tolist():
                    out.setdefault(m, set()).add(name)
    return out
