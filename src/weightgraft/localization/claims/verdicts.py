"""A claim's verdict from its row: one p-value per row, the largest of its parts, Holm-adjusted once
over one family (every judged row a run prints), and the interval beside it.

The parts of a row's p (``p_parts``), each one-sided on the claim's side:
- the threshold test (``threshold_p``, ``stats.share_threshold_p``): Fieller's pivot, the test whose
  inversion is the share's interval (twice its one-sided p, times ``stats.means.SHARE_WIDENING``:
  the interval printed as 95% has Fieller's bounds at 99.99999%, the rule docs/statistics.md
  adopted), so a row that holds has its printed interval on the claim's side of the threshold;
- the null test: the region against its null draws (``null_p``);
- the control test, on a fact claim of an SFT model where the run has a control finetune: the
  region against the same region grafted from the control donor (``control_p``).

- *holds*: the Holm-adjusted p (``p_holm``) <= ``ALPHA``;
- *fails*: the interval lies wholly on the other side of the threshold;
- *undecided*: otherwise; the reason names the largest part. Where the interval is declined (the
  whole effect's interval at the wider level includes 0) the row is undecided; the sign test
  across prompts (``n_past_threshold``, ``sign_p_past``) is kept in claims.csv, not used, since it
  speaks of the median prompt, which at a true share past the threshold need not be past it (a `<`
  claim held falsely in up to 0.55 of samples that way, docs/statistics.md). An undecided row whose share lies
  past the threshold says about how many prompts like its own would decide it
  (``prompts_needed``, ``stats.prompts_needed``: its prompts resampled, seeded);
- *no effect*: the whole graft's interval does not lie on the side the finetune moves the answer
  (``expected_sign``: the donor does not carry the behaviour, as on a null finetune), or the effect
  the share is a share of (*within*) is not distinguishable from 0 (its t interval includes 0) or
  is below ``FLOOR`` of the whole donor-base gap: a ratio of noise;
- *no cells*: the prompts have no cell in the region; *shown*: a row shown, not judged;
- *precondition not met*: the setting's donor does not know the facts (``precondition`` says how).

The intervals printed beside the verdict are per-row intervals, not simultaneous ones, each at its
row's own level (``ci_level``: the level the rule holds on docs/statistics.md's designs), printed
beside it (``share_text``).
"""

from __future__ import annotations

import math

import pandas as pd

from weightgraft.localization.claims.regions import ALPHA
from weightgraft.stats import holm, least_p, level_text
from weightgraft.stats.needed import POWER

FLOOR = 0.05  # within's mean effect below this share of the whole donor-base gap: no effect
MIN_PROMPTS = 20  # fewer per map: refused, unless claims.min_prompts lowers it (rows then exploratory)


def _nan(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _needed(row: pd.Series) -> str:
    """What an undecided row's reason adds where more prompts like its own would decide it."""
    m = row.get("prompts_needed", float("nan"))
    if _nan(m):
        return ""
    return (f"; about {int(m)} prompts like these would put the interval past {row['threshold']:g} (in "
            f"{POWER:.0%} of seeded resamples of them, stats.prompts_needed)")


def _one(row: pd.Series) -> tuple[str, str]:
    verdict, why = _judge(row)
    return (verdict, why + _needed(row)) if verdict == "undecided" and row.get("n_prompts", 0) >= 3 else (verdict, why)


def _judge(row: pd.Series) -> tuple[str, str]:
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
    p_holm = row.get("p_holm", float("nan"))
    holds = not _nan(p_holm) and p_holm <= ALPHA
    largest = str(row.get("p_largest", ""))
    if _nan(row["ci_low"]):
        return "undecided", f"no interval: {row.get('interval_note', '')}"
    if _nan(row["null_p"]):
        drawn = str(row.get("null_drawn", ""))
        why = drawn.split(": ", 1)[1] if ": " in drawn else "no null set"
        verdict = "fails" if (row["ci_high"] < threshold if above else row["ci_low"] > threshold) else "undecided"
        return verdict, f"no null of its kind can be drawn on every prompt ({why})"
    wrong = row["ci_high"] < threshold if above else row["ci_low"] > threshold
    if wrong:
        return "fails", "the interval lies on the other side of the threshold"
    if holds:
        return "holds", ""
    return "undecided", f"Holm p {p_holm:.3g} > {ALPHA}: the {largest} test is the largest part"


PARTS = (("threshold", "threshold_p"), ("null", "null_p"), ("control", "control_p"))


def _row_p(row: pd.Series) -> tuple[float, str, str]:
    """The row's p (the largest of its parts), the largest part's name and every part as text."""
    parts = []
    for name, column in PARTS:
        value = row.get(column, float("nan"))
        if name == "control" and _nan(value):
            continue  # no control finetune in this run, or not a fact claim of an SFT model
        parts.append((name, float(value) if not _nan(value) else float("nan")))
    if not parts or any(math.isnan(v) for _, v in parts):
        return float("nan"), "", "; ".join(f"{n}: {v:.4g}" for n, v in parts)
    name, value = max(parts, key=lambda x: x[1])
    return value, name, "; ".join(f"{n}: {v:.4g}" for n, v in parts)


def decide(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with ``p`` (each row's largest part), ``p_parts``, ``p_holm`` (Holm over every
    judged row given: one family), ``family_size``, ``verdict`` and ``reason``."""
    out = rows.copy()
    row_ps = [_row_p(r) for _, r in out.iterrows()]
    out["p"] = [p for p, _, _ in row_ps]
    out["p_largest"] = [name for _, name, _ in row_ps]
    out["p_parts"] = [text for _, _, text in row_ps]
    judged = out["null_kind"].ne("none") & out["p"].notna()
    if "precondition" in out:
        judged &= out["precondition"].fillna("").eq("")
    out["p_holm"] = holm(out["p"].where(judged).to_numpy(dtype=float))
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


def share_text(share: float | None, low: float | None, high: float | None, level: float | None) -> str:
    """A share with its interval and that interval's own level, ``0.90 [0.79, 0.98] (95%)``: a row
    of rules 8 widened for skew says 99%, and one written before the level was kept says so rather
    than 95%."""
    if _nan(share):
        return "n/a"
    if _nan(low) or _nan(high):
        return f"{share:.2f} (no interval)"
    return f"{share:.2f} [{low:.2f}, {high:.2f}] ({level_text(None if _nan(level) else level)})"
