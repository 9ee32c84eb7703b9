"""``weightgraft.compare``: several schemes over prompts with answers, as the runner's table.

The rows come from the runner's own pieces (``experiments.examples.prepare``,
``experiments.scoring.compute_logits`` / ``score_rows``), so a column the runner gains appears
here too."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from weightgraft.data.prompts import TestPrompt
from weightgraft.experiments.examples import Exclusions, prepare
from weightgraft.experiments.metrics import add_recovery
from weightgraft.experiments.scoring import baselines, compute_logits, score_rows
from weightgraft.schemes.binding import GraftInputError, Rules, Spans, one_or_many, prepare_graft
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL
from weightgraft.schemes.scheme import Scheme

if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn
    from transformers import PreTrainedTokenizerBase

def compare(
    models: Mapping[str, nn.Module], tokenizer: PreTrainedTokenizerBase, prompts: str | Sequence[str],
    answers: str | Sequence[str], schemes: Rules | Sequence[Scheme],
    *, spans: Spans | Mapping[str, Any] = None, protocol: str = DEFAULT_PROTOCOL,
    batch_size: int = 16, score_answer: bool = True, model_set: str = "default",
    template: str = "custom", prefix_sharing: bool = True,
) -> pd.DataFrame:
    """One row per (prompt, scheme): the answer's first token's rank and probability, top-k
    hits, the answer's log-probability, the top tokens — the rows of a run's
    ``results.parquet`` (``example_id`` is the prompt's index).

    ``schemes`` are presets (``weightgraft.presets.position()``) or your own
    :class:`~weightgraft.Scheme` objects over the roles of ``models``; one Rule or a list of
    Rules is one scheme named ``graft`` over the first role, as in :func:`weightgraft.graft`; ``spans`` as in
    :func:`weightgraft.graft` (one prompt may be a string, with its answer a string). Every prompt must be placeable by every scheme: one that is not
    is an error naming it (a comparison never drops prompts silently).
    """
    if batch_size < 1:
        raise GraftInputError("batch_size must be at least 1")
    if isinstance(prompts, str) and isinstance(answers, str):  # one prompt and its answer
        answers = [answers]
    prompts, spans = one_or_many(prompts, spans)
    prepared = prepare_graft(models, schemes, many=True, prompts=prompts, spans=spans, tokenizer=tokenizer,
                             protocol=protocol)
    roles, ordered, schemes, compiled = prepared.roles, prepared.models, prepared.schemes, prepared.compiled
    prompt_spans = prepared.spans
    if isinstance(answers, str) or len(list(answers)) != len(prompts):
        n = 1 if isinstance(answers, str) else len(list(answers))
        raise GraftInputError(f"answers has {n} entries for {len(prompts)} prompts (one answer per prompt)")
    for i, a in enumerate(answers):
        if not isinstance(a, str) or not a.strip():
            raise GraftInputError(f"answer {i} must be a non-empty string, got {a!r}")
    records = [
        TestPrompt(id=str(i), relation_id=str(i), template=template, prompt=p, answer=a, spans=s)
        for i, (p, a, s) in enumerate(zip(prompts, answers, prompt_spans, strict=True))
    ]
    exclusions = Exclusions()
    examples = prepare(records, tokenizer, compiled, model_set, exclusions)
    if exclusions.rows:
        first = exclusions.rows[0]
        i = int(first["example_id"])
        more = f" (and {len(exclusions.rows) - 1} more)" if len(exclusions.rows) > 1 else ""
        raise GraftInputError(f"prompt {i} ({prompts[i]!r}): {first['reason']}{more}")
    meta = {s.name: {"family": s.family, "labels": json.dumps(s.labels, sort_keys=True)} for s in schemes}
    items = [(ex, s.name) for ex in examples for s in schemes]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    base = baselines(schemes, roles[0])
    rows: list[dict[str, Any]] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        logits, n_logits, donors = compute_logits(ordered, chunk, pad_id, score_answer, prefix_sharing, base)
        rows += score_rows(chunk, logits, n_logits, tokenizer, model_set, meta, donors, base)
    return add_recovery(pd.DataFrame(rows))
