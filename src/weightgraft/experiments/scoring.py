"""Scoring a batch of (example, scheme) items: one grafted forward pass, then one metrics row
per item (the rows ``results.parquet`` holds; ``weightgraft.compare`` returns the same).

Behaviour metrics beside rank and probability: the logit difference between the answer and
the distractor, and KL(donor || grafted) of the next-token distribution. "The donor" of a
scheme is the one role other than the model set's first (the recipient, PRE) that the scheme
uses (its rules' role in pre -> sft, its base in sft -> pre); a baseline scheme with no
donor of its own (PRE) takes the sweep's donor when the sweep has exactly one. The donor's
own distribution is the sweep's donor baseline scheme (no rules, base = the donor): its row
in the same batch when there is one, else one more item in the batch, so KL needs that
baseline among the schemes (without it KL is NaN, never a guess).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from weightgraft.data.prompts import answer_token_ids
from weightgraft.engine.metric_table import ScoreInputs, row_metrics
from weightgraft.engine.sharing.prefix import GraftItem, prefix_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.experiments.answer_tokens import REFUSED, distractor_flag, scored_on
from weightgraft.experiments.examples import Prepared
from weightgraft.experiments.prediction import answer_logprob, score_next_token, whole_character_prefix
from weightgraft.schemes.scheme import Scheme


@dataclass(frozen=True)
class Baselines:
    """Per scheme: its donor role and the names of the no-rule schemes that serve the
    recipient (first role) and the donor whole, where the sweep has them."""

    donor_role: dict[str, str | None]
    base_scheme: dict[str, str | None]
    donor_scheme: dict[str, str | None]


def baselines(schemes: Sequence[Scheme], first_role: str) -> Baselines:
    """Which model is "the donor" of each scheme, and the baseline schemes of the sweep."""
    whole = {s.base: s.name for s in reversed(schemes) if not s.rules}
    own = {s.name: s.named_roles() - {first_role} for s in schemes}  # a scaled rule's donor is its model
    named = set().union(*own.values()) if own else set()
    sweep_donor = next(iter(named)) if len(named) == 1 else None
    donor: dict[str, str | None] = {}
    for s in schemes:
        roles = own[s.name]
        donor[s.name] = next(iter(roles)) if len(roles) == 1 else (sweep_donor if not roles else None)
    return Baselines(
        donor_role=donor,
        base_scheme={s.name: whole.get(first_role) for s in schemes},
        donor_scheme={s.name: whole.get(donor[s.name]) if donor[s.name] else None for s in schemes},
    )


def compute_logits(
    models: Sequence[Any], chunk: Sequence[tuple[Prepared, str]], pad_id: int, score_answer: bool = True,
    share: bool = True, base: Baselines | None = None,
) -> tuple[torch.Tensor, list[int], list[torch.Tensor | None]]:
    """Logits at the scored positions of one batch of (example, scheme) items, and per item
    the donor baseline's next-token logits (None where the scheme has no donor baseline)."""
    items, n_logits = _graft_items(chunk, score_answer)
    where: dict[tuple[int, str], int] = {(id(ex), s): b for b, (ex, s) in enumerate(chunk)}
    donor_at: list[int | None] = []
    for ex, scheme in chunk:
        name = base.donor_scheme.get(scheme) if base is not None else None
        if name is None or name not in ex.sources:
            donor_at.append(None)
            continue
        if (id(ex), name) not in where:  # not in this batch: one more row, its last prompt logit
            where[(id(ex), name)] = len(items)
            extra, _ = _graft_items([(ex, name)], score_answer=False)
            items.extend(extra)
        donor_at.append(where[(id(ex), name)])
    logits = prefix_forward(models, items, pad_id, share=share).float().cpu()
    donors = [logits[i, 0] if i is not None else None for i in donor_at]
    return logits[: len(chunk)], n_logits, donors


def _graft_items(chunk, score_answer: bool) -> tuple[list[GraftItem], list[int]]:
    """The batch as ``prefix_forward`` items: answer tokens after the prompt take the last
    prompt token's weights; logits from the last prompt token on."""
    items, n_logits = [], []
    for ex, scheme in chunk:
        extra = ex.answer_ids[:-1] if score_answer else []
        heads = {name: _extend(h, len(extra)) for name, h in ex.heads.get(scheme, {}).items()}
        items.append(GraftItem(
            input_ids=ex.input_ids + extra, maps=SourceMap(_extend(ex.sources[scheme], len(extra)), heads),
            logit_start=len(ex.input_ids) - 1, n_logits=1 + len(extra),
        ))
        n_logits.append(1 + len(extra))
    return items, n_logits


def _extend(src: torch.Tensor, n: int) -> torch.Tensor:
    """Continuation positions (answer tokens) take the last prompt token's weights."""
    return torch.cat([src, src[-1:].expand(n, *src.shape[1:])], dim=0) if n else src


class DistractorColumns(TypedDict):
    """A results row's distractor columns: its first token and why the logit difference is flagged or refused."""

    distractor_token: str | None
    logit_diff_flag: str


class FirstCharacter(TypedDict):
    """A results row's first-character columns (:func:`_first_character`)."""

    target_partial: bool
    first_character_logprob: float


def _distractor(tokenizer, answer: str, answer_token: str,
                distractor: str | None) -> tuple[int | None, DistractorColumns]:
    """The distractor's first token id for the logit difference (None: no distractor, or one
    whose first token and the answer's begin each other's names, refused), and its columns."""
    ids = answer_token_ids(tokenizer, distractor) if distractor else []
    if not ids:
        return None, DistractorColumns(distractor_token=None, logit_diff_flag="")
    token = tokenizer.decode([ids[0]])
    flag = distractor_flag(answer, answer_token, str(distractor), token)
    columns = DistractorColumns(distractor_token=token, logit_diff_flag=flag)
    return (None if flag.startswith(REFUSED) else ids[0]), columns


def score_rows(
    items, logits, n_logits, tokenizer, model_set, scheme_meta,
    donor_logits: Sequence[torch.Tensor | None] | None = None, base: Baselines | None = None,
) -> list[dict[str, Any]]:
    """One results row per item; ``scored_on`` says which token the first-token metrics read
    (dataset-wide flags on it are added after the sweep, ``answer_tokens.add_answer_flags``)."""
    rows = []
    for b, (ex, scheme) in enumerate(items):
        p = ex.prompt
        pred = score_next_token(logits[b, 0], ex.answer_ids[0])
        target_token = tokenizer.decode([pred.target_token_id])
        distractor, distractor_cols = _distractor(tokenizer, p.answer, target_token, p.distractor)
        donor = donor_logits[b] if donor_logits is not None else None
        metrics = row_metrics(ScoreInputs(logits=logits[b, : n_logits[b]], answer_ids=ex.answer_ids, prediction=pred,
                                         distractor=distractor, donor_logits=donor, other_answers=ex.other_answers))
        row = {
            "model_set": model_set, "template": p.template, "scheme": scheme,
            "family": scheme_meta[scheme]["family"], "labels": scheme_meta[scheme]["labels"],
            "example_id": p.id, "relation_id": p.relation_id, "direction": p.direction or "",
            "prompt": p.prompt, "answer": p.answer,
            "target_token_id": pred.target_token_id, "target_token": target_token,
            "n_answer_tokens": n_logits[b], "scored_on": scored_on(target_token, n_logits[b], len(ex.answer_ids)),
            "top_tokens": [tokenizer.decode([i]) for i in pred.top_ids],
            "top_probs": pred.top_probs, "finite": pred.finite,
            "distractor": p.distractor, **distractor_cols,
            **metrics,
            **_baseline_fields(scheme, base),
            **_first_character(tokenizer, ex.answer_ids, logits[b, : n_logits[b]], pred.finite),
        }
        rows.append(row)
    return rows


def _baseline_fields(scheme: str, base: Baselines | None) -> Mapping[str, str | None]:
    """Which donor and which baseline rows the behaviour metrics of this row refer to."""
    if base is None:
        return {"donor_role": None, "base_scheme": None, "donor_scheme": None}
    return {"donor_role": base.donor_role[scheme], "base_scheme": base.base_scheme[scheme],
            "donor_scheme": base.donor_scheme[scheme]}


def _first_character(tokenizer, answer_ids, logits, finite: bool) -> FirstCharacter:
    """``target_partial``: the scored first token is a piece of a character (flagged, counted);
    ``first_character_logprob``: log-probability of the tokens that make the first whole
    character (needs ``score_answer``; NaN otherwise), a target that identifies the answer."""
    n = whole_character_prefix(tokenizer, answer_ids)
    ok = finite and n <= logits.shape[0]
    return FirstCharacter(target_partial=n > 1,
                          first_character_logprob=answer_logprob(logits[:n], answer_ids[:n]) if ok else float("nan"))
