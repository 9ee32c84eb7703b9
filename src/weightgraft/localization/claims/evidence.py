"""Can a localize config's claims reach a verdict at all? Said before anything runs (by
``localize`` itself and by ``weightgraft plan``), naming the setting to change: too few prompts
per map for ``claims.min_prompts``, or a family of tests whose least Holm-adjusted p cannot reach
``ALPHA`` with the prompts and resamples given (flagged: the run goes on, its claims say why)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from weightgraft.localization.claims.regions import ALPHA, BOTH_A2B, CLAIMS
from weightgraft.localization.claims.verdicts import MIN_PROMPTS, family_floor


@dataclass(frozen=True)
class Evidence:
    """The claims' family and the least p it can reach; ``problem`` says what blocks a verdict."""

    n_prompts: int  # the fewest prompts a map has
    family: int  # judged tests the run prints
    floor: float  # the least Holm-adjusted p of the family
    exploratory: bool
    problem: str = ""  # refused: too few prompts per map
    warning: str = ""  # flagged: no claim of the family can reach ALPHA


def claims_evidence(config: Any, prompts: Sequence[Any], n_reversal: int = 0) -> Evidence:
    """The family of judged claim tests the config asks for and whether a claim can hold in it."""
    settings = config.claims
    counts = Counter(p.template for p in prompts)
    cap = settings.prompts or max(counts.values(), default=0)
    n = min((min(c, cap) for c in counts.values()), default=0)
    judged = [c for c in CLAIMS if c.judged]
    models = len(config.mapped_models())
    family = len(judged) * len(counts) * len(config.graft_directions) * models
    if n_reversal:
        donors = 1 + len(config.reversal.controls) if config.reversal is not None else 1
        family += sum(c.paper_setting == BOTH_A2B for c in judged) * donors
        n = min(n, min(n_reversal, cap))
    floor = family_floor(n, family, settings.resamples)
    problem = warning = ""
    smallest = min(counts, key=lambda t: counts[t]) if counts else "?"
    if n < settings.min_prompts:
        problem = (f"claims: {n} prompts per map (template {smallest!r}), fewer than claims.min_prompts "
                   f"({settings.min_prompts}); raise 'limit' or 'claims.prompts', or lower claims.min_prompts "
                   "(the rows are then exploratory)")
    if floor > ALPHA:
        warning = (f"claims: the least Holm-adjusted p of {family} tests on {n} prompts is {floor:.3g} > {ALPHA}: no "
                   "claim could hold; raise claims.resamples, use more prompts, or set claims.enabled: false")
    return Evidence(n, family, floor, n < MIN_PROMPTS, problem, warning)


def claims_notes(config: Any) -> list[str]:
    """What ``weightgraft plan`` says of a localize config's claims: the family, the least p it
    can reach, and what would refuse or flag the run."""
    if not config.claims.enabled:
        return []
    from weightgraft.localization.prompts import localize_prompts

    chosen = localize_prompts(config)
    found = claims_evidence(config, chosen.mapped, len(chosen.reversal))
    notes = [f"claims: {found.family} judged tests on at least {found.n_prompts} prompts per map, one Holm family; "
             f"the least adjusted p is {found.floor:.2g}" + (" (rows exploratory)" if found.exploratory else "")]
    if found.problem:
        notes.append(f"refused by localize: {found.problem}")
    if found.warning:
        notes.append(f"flagged: {found.warning}")
    return notes
