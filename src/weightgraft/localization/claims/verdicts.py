"""A claim's verdict from its row: the interval against the threshold and the region against its
null across prompts, Holm-adjusted over one family (every judged row a run prints).

- *holds*: the interval lies wholly on the claim's side of the threshold and the region beats its
  null (Holm-adjusted p <= ``ALPHA``);
- *fails*: the interval lies wholly on the other side;
- *undecided*: otherwise, or where the interval was declined (the row's ``interval_note`` says why);
  where it was declined for skew, the sign test across prompts decides instead (is the region past
  the threshold's part of within on most prompts: ``n_past_threshold``, ``sign_p_past``; one-sided
  at ``SIGN_ALPHA``), and the reason says so: a statement about the median prompt, not the mean;
- *no effect*: the whole graft's interval does not lie on the side the finetune moves the answer
  (``expected_sign``: the donor does not carry the behaviour, as on a null finetune), or the effect
  the share is a share of (*within*) is not distinguishable from 0 (its t interval includes 0) or
  is below ``FLOOR`` of the whole donor-base gap: a ratio of noise;
- *no cells*: the prompts have no cell in the region; *shown*: a row shown, not judged;
- *precondition not met*: the setting's donor does not know the facts (``precondition`` says how).
"""

from __future__ import annotations

import math

import pandas as pd

from weightgraft.localization.claims.regions import ALPHA
from weightgraft.stats import holm, least_p

FLOOR = 0.05  # within's mean effect below this share of the whole donor-base gap: no effect
SIGN_ALPHA = 0.025  # one side of a 95% interval: the sign test's level where skew declines the interval
MIN_PROMPTS = 20  # fewer per map: refused, unless claims.min_prompts lowers it (rows then exploratory)


def _nan(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _one(row: pd.Series) -> tuple[str, str]:
    if row.get("precondition"):
        return "precondition not met", str(row["precondition"])
    if row["n_region_keys"] == 0:
        return "no cells", "the prompts have no cell in the region"
    if row["null_kind"] == "none":
        return "shown", "shown beside the claims, not judged"
    if row["n_prompts"] < 3:
        return "undecided", "fewer than 3 prompts"
    sign = row.get("expected_sign", 1)
    wl, wh = row.get("whole_ci_low", float("nan")), row.get("whole_ci_high", float("nan"))
    if not _nan(wl) and not (sign * wl > 0 and sign * wh > 0):
        return "no effect", (f"the whole graft does not move the answer the finetune's way (whole effect "
                             f"{row['whole_effect']:.3g} [{wl:.3g}, {wh:.3g}]): no behaviour to localize")
    low, high = row["within_ci_low"], row["within_ci_high"]
    if not _nan(low) and low <= 0 <= high or row.get("within_note", "").startswith("the whole effect's interval"):
        return "no effect", "within's interval includes 0"
    whole = row.get("whole_effect", float("nan"))
    if not _nan(whole) and sign * row["within_effect"] < FLOOR * abs(whole):
        return "no effect", f"within's effect is below {FLOOR:.0%} of the whole donor-base gap ({whole:.3g})"
    threshold, above = row["threshold"], row["side"] == ">"
    beats = not _nan(row["null_p_holm"]) and row["null_p_holm"] <= ALPHA
    if _nan(row["ci_low"]):
        note = str(row.get("interval_note", ""))
        if not note.startswith("effects too skewed") or _nan(row.get("sign_p_past", float("nan"))):
            return "undecided", f"no interval: {note}"
        # skew leaves the mean no interval: the sign test says on how many prompts it is past the threshold
        n, k = int(row["n_prompts"]), int(row["n_past_threshold"])
        said = (f"no interval ({note}); on {k} of {n} prompts the region is past {threshold:g} of within "
                f"(sign test p {row['sign_p_past']:.2g})")
        if row["sign_p_short"] <= SIGN_ALPHA:
            return "fails", said
        if row["sign_p_past"] <= SIGN_ALPHA and beats:
            return "holds", said
        return "undecided", said + ("" if row["sign_p_past"] <= SIGN_ALPHA else f", not <= {SIGN_ALPHA}")
    if _nan(row["null_p"]):
        drawn = str(row.get("null_drawn", ""))
        why = drawn.split(": ", 1)[1] if ": " in drawn else "no null set"
        verdict = "fails" if (row["ci_high"] < threshold if above else row["ci_low"] > threshold) else "undecided"
        return verdict, f"no null of its kind can be drawn on every prompt ({why})"
    right = row["ci_low"] > threshold if above else row["ci_high"] < threshold
    wrong = row["ci_high"] < threshold if above else row["ci_low"] > threshold
    if wrong:
        return "fails", "the interval lies on the other side of the threshold"
    if right and beats:
        return "holds", ""
    if right:
        return "undecided", f"does not beat its null (Holm p {row['null_p_holm']:.3g} > {ALPHA})"
    return "undecided", "the interval includes the threshold"


def decide(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with ``null_p_holm`` (Holm over every judged row given: one family),
    ``p_floor`` (the least p each row could reach), ``verdict`` and ``reason``."""
    out = rows.copy()
    judged = out["null_kind"].ne("none") & out["null_p"].notna()
    if "precondition" in out:
        judged &= out["precondition"].fillna("").eq("")
    adjusted = holm(out["null_p"].where(judged).to_numpy(dtype=float))
    out["null_p_holm"] = adjusted
    out["family_size"] = int(judged.sum())
    pairs = [_one(r) for _, r in out.iterrows()]
    out["verdict"] = [v for v, _ in pairs]
    out["reason"] = [why for _, why in pairs]
    return out


def family_floor(n_prompts: int, family: int, n_resamples: int) -> float:
    """The least Holm-adjusted p a family of ``family`` tests on ``n_prompts`` prompts can reach."""
    return min(1.0, family * least_p(n_prompts, n_resamples=n_resamples))


def p_text(p: float, floor: float) -> str:
    """A p at its floor is printed as ``<= floor``."""
    if _nan(p):
        return "n/a"
    return f"<= {floor:.2g}" if p <= floor * (1 + 1e-9) else f"{p:.3g}"
