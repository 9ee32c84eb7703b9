"""The claims along a training run: each claim's verdict at every saved step, and the step from
which it holds at every later step.

A localize run whose SFT models are snapshots of one finetune (``models.sft`` a list of
``checkpoint(DIR, step=K)``) judges every claim on every snapshot, all rows one Holm family
(:mod:`weightgraft.localization.claims.verdicts`). Here those rows are read by step. A claim's
first held step is the earliest saved step at which it holds and after which it holds at every
saved step; the claim started to hold after the saved step before it and by that one (the
interval of the step is the save spacing). Since every *holds* is a Holm-adjusted verdict of one
family, the chance that any claim is said to hold at a step where it does not is at most the
family's level (0.05): the first held step is not reported earlier than the truth more often
than that (held by a seeded simulation in tests/localization/test_claims_steps.py). A claim that does not
hold at the last step has no first held step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.localization.claims.verdicts import share_text

KEYS = ("setting", "direction", "template", "claim")
COLUMNS = (*KEYS, "steps", "verdicts", "first_held", "held_after", "share_exact", "ci_low", "ci_high", "ci_level",
           "last_verdict")


def snapshot_steps(snapshots: Sequence[tuple[str, int | None, Path | None]]) -> dict[str, int] | str:
    """Model label -> training step where every SFT model is a snapshot of one finetune at a step
    of its own (``(label, step, run folder)`` each); else why the claims cannot be read by step."""
    if len(snapshots) < 2 or all(step is None for _, step, _ in snapshots):
        return "fewer than two SFT models are snapshots of a finetune"
    if any(step is None for _, step, _ in snapshots):
        return "some SFT models are not snapshots of a finetune (checkpoint(DIR, step=K))"
    if len({run for _, _, run in snapshots}) > 1:
        return "the snapshots come from more than one finetune"
    steps = [step for _, step, _ in snapshots]
    if len(set(steps)) < len(steps):
        return "two SFT models are the same step"
    return {label: int(step) for label, step, _ in snapshots if step is not None}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def first_held_text(row: Mapping[str, Any]) -> str:
    """A ``claims_steps.csv`` row's first held step in words, with its share and interval there at
    the interval's own level (a file written before the level was kept: "level not recorded")."""
    if _missing(row["first_held"]):
        return f"never (the last step: {row['last_verdict']})"
    after = "the first saved step" if _missing(row["held_after"]) else f"after step {int(row['held_after'])}"
    share = share_text(row["share_exact"], row["ci_low"], row["ci_high"], row.get("ci_level"))
    return f"step {int(row['first_held'])} ({after}); share {share}"


def verdicts_text(row: Mapping[str, Any]) -> str:
    """A ``claims_steps.csv`` row's verdict at each step: ``step: verdict, ...``."""
    return ", ".join(f"{s}: {v}" for s, v in zip(str(row["steps"]).split(";"), str(row["verdicts"]).split(";")))


def first_held(steps: list[int], verdicts: list[str]) -> tuple[int | None, int | None]:
    """``(first held step, the saved step before it)`` of verdicts in step order: the earliest
    step from which every verdict is *holds* (None where the last is not; the step before it
    None where the claim holds from the first saved step)."""
    first = None
    for step, verdict in zip(reversed(steps), reversed(verdicts)):
        if verdict != "holds":
            break
        first = step
    if first is None:
        return None, None
    i = steps.index(first)
    return first, (steps[i - 1] if i > 0 else None)


def claims_along_steps(table: pd.DataFrame, steps: Mapping[str, int]) -> pd.DataFrame:
    """One row per judged claim (setting, direction, template) over the models ``steps`` names
    (model label -> training step): its verdicts by step, its first held step, the saved step
    before it, and its share with its interval and the interval's level at the first held step."""
    rows = table[table["model"].isin(list(steps)) & (table["verdict"] != "shown")]
    out = []
    for key, group in rows.groupby(list(KEYS), sort=False):
        group = group.assign(step=group["model"].map(steps)).sort_values("step")
        order = [int(s) for s in group["step"]]
        verdicts = [str(v) for v in group["verdict"]]
        first, before = first_held(order, verdicts)
        at = group[group["step"] == first].iloc[0] if first is not None else None
        out.append({**dict(zip(KEYS, key)), "steps": ";".join(map(str, order)), "verdicts": ";".join(verdicts),
                    "first_held": first, "held_after": before,
                    **{c: (float(at.get(c, float("nan"))) if at is not None else float("nan"))
                       for c in ("share_exact", "ci_low", "ci_high", "ci_level")},
                    "last_verdict": verdicts[-1]})
    return pd.DataFrame(out, columns=list(COLUMNS))
