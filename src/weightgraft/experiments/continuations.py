"""Grafted continuations of a sweep: what each scheme's grafted model says after a few of the
sweep's prompts (``continuations.csv``, shown in the report)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from weightgraft.engine.generate import generate_one
from weightgraft.experiments.examples import Prepared
from weightgraft.schemes.scheme import CompiledScheme


class ContinuationRow(TypedDict):
    """A row of ``continuations.csv``: a prompt, a scheme, and the grafted model's greedy text
    after it (or why it could not be generated)."""

    model_set: str
    template: str
    example_id: str
    scheme: str
    prompt: str
    answer: str
    continuation: str | None
    error: str | None


def sweep_continuations(
    models: Sequence[Any], tokenizer: Any, prepared: Sequence[Prepared], *, compiled: Sequence[CompiledScheme],
    n_examples: int, max_new_tokens: int, schemes: Sequence[str] | None, served: Mapping[int, set[str]],
    model_set: str,
) -> list[ContinuationRow]:
    """Greedy continuations of the first ``n_examples`` prompts under each scheme; a scheme that
    cannot be generated here (a step would need a slot a lean donor does not hold) gets its
    reason in ``error`` instead of a text."""
    names = compiled[0].slot_names if compiled else ()
    held = {m: {names.index(s) for s in slots} for m, slots in served.items()}
    rows: list[ContinuationRow] = []
    for ex in prepared[:n_examples]:
        for c in compiled:
            if schemes is not None and c.name not in schemes:
                continue
            row = ContinuationRow(model_set=model_set, template=ex.prompt.template, example_id=ex.prompt.id,
                                  scheme=c.name, prompt=ex.prompt.prompt, answer=ex.prompt.answer,
                                  continuation=None, error=None)
            try:
                out = generate_one(models, tokenizer, ex.prompt.prompt, compiled=c, spans=ex.prompt.spans,
                                   max_new_tokens=max_new_tokens, held=held, answer_field=ex.prompt.answer_field)
                row["continuation"] = out.text
            except ValueError as exc:
                row["error"] = str(exc)
            rows.append(row)
    return rows
