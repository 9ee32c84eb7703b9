"""Claims 4-5 where the paper made them (Figure 4, ``reversal:`` in a localize config): the
model finetuned on both directions of the relation (donor) grafted into the model finetuned on
a2b (recipient), on the b2a prompts of the headline template, at the last token. The prompts
are checked before any model loads; the maps' estimates (for ``share_estimate``) are gradients
of the same pair (none with ``estimates: false``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd
import torch

from weightgraft.data.prompts import TestPrompt
from weightgraft.engine.partial import PartialGraft
from weightgraft.localization.claims.regions import BOTH_A2B, CLAIMS
from weightgraft.localization.claims.stage import map_claims
from weightgraft.localization.config import LocalizeConfig
from weightgraft.localization.examples import build_examples
from weightgraft.localization.maps import blank_frame, estimate_frame
from weightgraft.localization.prompts import roles_checked
from weightgraft.models.tokenization import check_same_tokenizer

LABEL = "reversal"  # the model column of the reversal rows


DONOR_TOP5 = 0.8  # the paper's precondition: the donor knows the reversed facts (its top-5 on the prompts)


@torch.no_grad()
def _scores(model: torch.nn.Module, examples: Sequence[Any]) -> tuple[float, float]:
    """Top-5 rate and mean log-probability of each example's scored first answer token."""
    hits, logprobs = [], []
    device = next(model.parameters()).device
    for e in examples:
        s = e.scored
        logits = model(input_ids=torch.tensor([s.input_ids], device=device)).logits[0, s.position].float()
        hits.append(bool((logits.topk(5).indices == s.target).any()))
        logprobs.append(float(torch.log_softmax(logits, -1)[s.target]))
    return sum(hits) / len(hits), sum(logprobs) / len(logprobs)


class ReversalPrecondition(TypedDict):
    """A reversal setting's precondition on its own prompts (its table's columns, less ``precondition``)."""

    donor_top5: float
    recipient_top5: float
    donor_logprob: float
    recipient_logprob: float
    pre_logprob: float
    recipient_below_pre: float
    precondition: str  # '' where the donor knows the reversed facts, else why not


def precondition_check(pre: torch.nn.Module, recipient: torch.nn.Module, donor: torch.nn.Module,
                       examples: Sequence[Any]) -> ReversalPrecondition:
    """The setting's precondition on its own prompts: the donor's and the recipient's top-5, how
    far the recipient's log-probability of the answer sits below PRE's, and ``precondition``
    ('' where the donor's top-5 reaches ``DONOR_TOP5``, else why not)."""
    donor_top5, donor_lp = _scores(donor, examples)
    recipient_top5, recipient_lp = _scores(recipient, examples)
    _, pre_lp = _scores(pre, examples)
    why = "" if donor_top5 >= DONOR_TOP5 else (
        f"the donor ranks {donor_top5:.0%} of the reversed answers in its top 5 (the setting needs >= "
        f"{DONOR_TOP5:.0%}): it does not know the reversed facts")
    return ReversalPrecondition(donor_top5=donor_top5, recipient_top5=recipient_top5, donor_logprob=donor_lp,
                                recipient_logprob=recipient_lp, pre_logprob=pre_lp,
                                recipient_below_pre=pre_lp - recipient_lp, precondition=why)


def reversal_claims(config: LocalizeConfig, prompts: list[TestPrompt], load: Callable[[str, torch.dtype], Any],
                    *, dtype: torch.dtype, pad_id: int, parts: Path, say: Callable[..., None],
                    pre: torch.nn.Module) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The both->a2b claims' rows (``model`` = ``reversal``, and ``reversal control[i]`` for each
    control donor), each judged only where its donor meets the setting's precondition, and their
    per-prompt effects."""

    setting = config.reversal
    assert setting is not None, "reversal claims need a config with reversal:"
    recipient = load(setting.recipient, dtype)
    examples, excluded = build_examples(prompts, recipient.tokenizer)
    if excluded:
        say(f"reversal: {len(excluded)} prompt(s) excluded: {excluded[:3]}")
    claims = [c for c in CLAIMS if c.paper_setting == BOTH_A2B]
    import hashlib

    # the setting's models and prompts are outside the run's identity: their results are kept apart by them
    folder = parts / LABEL / hashlib.sha256(setting.model_dump_json().encode()).hexdigest()[:12]
    tables, per_prompts, roles = [], [], roles_checked(setting)
    donors = [(LABEL, "donor", setting.donor)]
    donors += [(f"{LABEL} control[{i}]", "control", spec) for i, spec in enumerate(setting.controls)]
    for label, role, spec in donors:  # one donor in memory at a time
        donor = load(spec, dtype)
        check_same_tokenizer(recipient.tokenizer, donor.tokenizer, f"reversal {role}")
        t0 = time.time()
        if config.estimates:
            estimates = estimate_frame(PartialGraft(recipient.model, donor.model), examples, "sufficiency", metric=config.metric,
                                       batch_size=config.batch_size)
            say(f"[{label}] estimates of every cell: {time.time() - t0:.1f}s")
        else:  # estimates: false: the cells' rows only (share_estimate NaN)
            estimates = blank_frame(recipient.model, examples, "sufficiency")
        check = precondition_check(pre, recipient.model, donor.model, examples)
        say(f"[{label}] donor top-5 {check['donor_top5']:.0%}, recipient top-5 {check['recipient_top5']:.0%}, "
            f"recipient {check['recipient_below_pre']:.2f} nats below PRE"
            + (f": {check['precondition']}" if check["precondition"] else ""))
        where = folder / label.replace(" ", "_").replace("[", "").replace("]", "")
        where.mkdir(parents=True, exist_ok=True)
        table, per_prompt = map_claims([recipient.model, donor.model], examples, estimates, model_label=label, direction="sufficiency",
                                       setting=BOTH_A2B, settings=config.claims, seed=config.seed, pad_id=pad_id, metric=config.metric, chunk=config.exact_chunk,
                                       parts=where, say=say, claims=claims, precondition=check["precondition"])
        tables.append(table.assign(donor=spec, donor_role=role, recipient=setting.recipient,
                                   prompt_direction=setting.direction, roles=roles,
                                   **{k: v for k, v in check.items() if k != "precondition"}))
        per_prompts.append(per_prompt)
        del donor
    table, per_prompt = pd.concat(tables, ignore_index=True), pd.concat(per_prompts, ignore_index=True)
    return table, per_prompt
