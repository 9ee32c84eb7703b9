"""Summaries of a sweep's rows: recovery from the baseline rows, and per (model set, template,
direction, scheme) every metric of ``metric_table.METRIC_TABLE`` aggregated as it says, with
confidence intervals from ``weightgraft.stats`` (Clopper-Pearson rates, t means, Fieller ratios)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from weightgraft.engine import metric_table
from weightgraft.engine.metric_table import MetricSpec
from weightgraft.experiments.answer_tokens import add_answer_flags, logit_diff_note
from weightgraft.stats import mean_ci, rate_cis, share_interval

# |SFT - PRE| below which a per-example recovery is flagged (and left out of paired
# differences): the ratio of two near-equal log-probs says nothing about the graft.
MIN_RECOVERY_GAP = 0.1
# The summary's recovery is flagged as unstable below these (mean gap in nats, examples) or
# where its interval is declined.
STABLE_MEAN_GAP = 0.5
STABLE_N = 10
# per-example column -> the log-probability it is the recovery of
RECOVERY_OF = {m.name: m.recovery_of for m in metric_table.METRIC_TABLE if m.recovery_of is not None}


def add_recovery(results: pd.DataFrame) -> pd.DataFrame:
    """Per example, from the base and donor baseline rows of the same model set, template and
    example: ``recovery`` = (grafted - PRE) / (SFT - PRE) of the answer's first-token
    log-probability (the paper's target), ``recovery_answer`` the same of the whole answer's
    teacher-forced log-probability; ``*_gain`` (grafted - PRE) and ``*_gap`` (SFT - PRE) are
    kept for the summary's ratio of means; ``*_small_gap`` flags |SFT - PRE| <
    ``MIN_RECOVERY_GAP``. NaN where a baseline row is missing. First, the answers' first-token
    flags (``answer_tokens.add_answer_flags``): they too are read from the other rows, and they
    say which of the two recoveries to trust."""
    out = add_answer_flags(results)
    if "first_logprob" not in out.columns and "prob" in out.columns:  # rows of an older run
        with np.errstate(divide="ignore"):
            out["first_logprob"] = np.log(out["prob"].to_numpy(dtype=float))
    for name, source in RECOVERY_OF.items():
        if "base_scheme" not in out.columns or source not in out.columns:
            out[name], out[f"{name}_gain"], out[f"{name}_gap"] = float("nan"), float("nan"), float("nan")
            out[f"{name}_small_gap"] = False
            continue
        key = ["model_set", "template", "example_id"]
        lp = out.set_index([*key, "scheme"])[source]
        lp = lp[~lp.index.duplicated()]

        def lookup(col: str, key: list[str] = key, lp: pd.Series = lp) -> np.ndarray:
            idx = pd.MultiIndex.from_arrays([out[k] for k in key] + [out[col].fillna("")])
            return lp.reindex(idx).to_numpy(dtype=float)

        pre, sft = lookup("base_scheme"), lookup("donor_scheme")
        gain, gap = out[source].to_numpy(dtype=float) - pre, sft - pre
        with np.errstate(divide="ignore", invalid="ignore"):
            out[name] = np.where(np.isfinite(gap), gain / gap, np.nan)
        out[f"{name}_gain"], out[f"{name}_gap"] = gain, gap
        out[f"{name}_small_gap"] = np.abs(gap) < MIN_RECOVERY_GAP
    return out


def ratio_of_means(gain: np.ndarray, gap: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float, int, str]:
    """``mean(gain) / mean(gap)`` over the examples where both are finite, its interval
    (``weightgraft.stats.share_interval``: paired; held at ``1 - alpha`` on every design of
    docs/statistics.md by Fieller's bounds at a wider level; declined where the mean gap is not told
    from 0 at that level), the count, and
    a note where the number is unstable (few examples, a small mean gap, a declined interval).

    A mean of per-example ratios lets one example with a small gap dominate; the ratio of
    means weighs each example by its gap, which is what "the share of the SFT-PRE difference
    the graft restores" means."""
    ok = np.isfinite(gain) & np.isfinite(gap)
    gain, gap = gain[ok], gap[ok]
    n = int(gain.size)
    if n == 0 or gap.mean() == 0:
        return float("nan"), float("nan"), float("nan"), n, "undefined: no SFT-PRE gap" if n else ""
    interval = share_interval(gain, gap, level=1 - alpha)
    notes = []
    if n < STABLE_N:
        notes.append(f"few examples (n={n})")
    if abs(gap.mean()) < STABLE_MEAN_GAP:
        notes.append(f"small SFT-PRE gap ({gap.mean():.2f} nats)")
    if interval.declined:
        notes.append(f"no interval: {interval.declined}")
    return interval.value, interval.low, interval.high, n, ("unstable: " + "; ".join(notes)) if notes else ""


def _mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return float("nan"), float("nan"), float("nan")
    return mean_ci(values)


SUMMARY_KEYS = ["model_set", "template", "scheme"]


def _aggregate(spec: MetricSpec, ok: pd.DataFrame) -> dict[str, object]:
    """One metric's summary columns over the finite rows ``ok`` of one group (none where the
    results lack the metric's column)."""
    name, how = spec.name, spec.aggregate
    if how is None or (how == "ratio_of_means" and f"{name}_gain" not in ok.columns):
        return {}
    if how == "mean_ci" and name not in ok.columns:
        return {}
    values = ok[name].to_numpy(dtype=float) if name in ok.columns else np.array([])
    if how == "rate":
        out: dict[str, object] = {name: float(values.mean()) if len(values) else float("nan")}
        if spec.ci:
            out[f"{name}_lo"], out[f"{name}_hi"] = rate_cis(values)[1:]
        return out
    if how == "rank":
        return {f"mean_{name}": float(values.mean()) if len(values) else float("nan"),
                f"median_{name}": float(np.median(values)) if len(values) else float("nan")}
    if how == "mean":
        return {f"mean_{name}": float(ok[name].mean()) if len(ok) else float("nan")}
    if how == "mean_ci":
        mean, lo, hi = _mean_ci(values)
        out = {f"mean_{name}": mean, f"{name}_lo": lo, f"{name}_hi": hi, f"n_{name}": int(np.isfinite(values).sum())}
        if spec.flags is not None:
            out[f"{name}_note"] = logit_diff_note(ok[spec.flags]) if spec.flags in ok.columns else ""
        return out
    gain, gap = ok[f"{name}_gain"].to_numpy(dtype=float), ok[f"{name}_gap"].to_numpy(dtype=float)
    return dict(zip(spec.summary_columns(), ratio_of_means(gain, gap)))


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (model set, template, direction, scheme): n, top-k rates with 95% CIs,
    ranks, the behaviour metrics (logit difference, KL to the donor) with 95% CIs over the rows
    where they are defined (``n_<metric>``; ``logit_diff_note`` counts refused and weak ones),
    ``n_weak_first_token`` (rows whose first token does not identify the answer), and ``recovery`` / ``recovery_answer`` as a ratio
    of means with its Fieller interval and a ``*_note`` where the number is unstable. Every
    interval is ``weightgraft.stats``' (nothing is resampled, so the summary draws no random number).
    ``direction`` (a2b, b2a) is empty for prompts without one.

    Rows with non-finite logits are counted in ``n_nonfinite`` and left out of every average.
    """
    rows = []
    order = {name: i for i, name in enumerate(dict.fromkeys(results["scheme"]))}
    direction = results["direction"].fillna("").astype(str) if "direction" in results else ""
    results = results.assign(direction=direction)
    keys = [*SUMMARY_KEYS[:2], "direction", *SUMMARY_KEYS[2:]]
    for (model_set, template, direction, scheme), group in results.groupby(keys, sort=False):
        ok = group[group["finite"]]
        row = {
            "model_set": model_set, "template": template, "direction": direction, "scheme": scheme,
            "family": group["family"].iloc[0], "n": len(ok), "n_nonfinite": int((~group["finite"]).sum()),
            "n_weak_first_token": int(ok["weak_first_token"].sum()) if "weak_first_token" in ok else 0,
        }
        for spec in metric_table.METRIC_TABLE:
            row.update(_aggregate(spec, ok))
        row["_order"] = order[scheme]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["model_set", "template", "direction", "_order"]).drop(columns="_order").reset_index(drop=True)
