"""Metrics of one prediction and summaries over many, with bootstrap confidence intervals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

TOP_K: tuple[int, ...] = (1, 5, 10, 20, 50, 100)
N_TOP_TOKENS = 20


@dataclass(frozen=True)
class Prediction:
    """Metrics of the next-token distribution at the last prompt token."""

    target_token_id: int
    rank: int  # 0-based: how many tokens are strictly more probable than the target
    prob: float
    hits: dict[int, bool]
    top_ids: list[int]
    top_probs: list[float]
    finite: bool


def score_next_token(logits: torch.Tensor, target: int) -> Prediction:
    """Rank, probability and top-k hits of ``target`` under ``logits`` ([vocab])."""
    logits = logits.float()
    finite = bool(torch.isfinite(logits).all())
    if not finite:
        return Prediction(target, -1, float("nan"), {k: False for k in TOP_K}, [], [], False)
    probs = torch.softmax(logits, dim=-1)
    rank = int((logits > logits[target]).sum())
    top = torch.topk(probs, k=min(N_TOP_TOKENS, probs.numel()))
    return Prediction(
        target_token_id=target,
        rank=rank,
        prob=float(probs[target]),
        hits={k: rank < k for k in TOP_K},
        top_ids=top.indices.tolist(),
        top_probs=top.values.tolist(),
        finite=True,
    )


def answer_logprob(logits: torch.Tensor, answer_ids: Sequence[int]) -> float:
    """Sum of log-probabilities of every answer token, teacher-forced.

    ``logits`` are ``[len(answer_ids), vocab]``: row i predicts ``answer_ids[i]``.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(list(answer_ids), device=logits.device)
    return float(logp[torch.arange(len(idx), device=logits.device), idx].sum())


def logit_difference(logits: torch.Tensor, answer: int, distractor: int | None) -> float:
    """Answer logit minus distractor logit (first tokens); NaN without a distractor."""
    if distractor is None:
        return float("nan")
    logits = logits.float()
    return float(logits[answer] - logits[distractor])


def kl_divergence(donor_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(donor || grafted) in nats of two next-token distributions given as logits."""
    p = torch.log_softmax(donor_logits.double(), dim=-1)
    q = torch.log_softmax(logits.double(), dim=-1)
    return float((p.exp() * (p - q)).sum())


def first_token_logprob(logits: torch.Tensor, target: int) -> float:
    """Log-probability of the answer's first token (the token top-k is scored on)."""
    return float(torch.log_softmax(logits.double(), dim=-1)[target])


# |SFT - PRE| below which a per-example recovery is flagged (and left out of paired
# differences): the ratio of two near-equal log-probs says nothing about the graft.
MIN_RECOVERY_GAP = 0.1
# The summary's recovery is flagged as unstable below these (mean gap in nats, examples) or
# when the bootstrap's mean gap reaches zero.
STABLE_MEAN_GAP = 0.5
STABLE_N = 10
# per-example column -> the log-probability it is the recovery of
RECOVERY_OF = {"recovery": "first_logprob", "recovery_answer": "answer_logprob"}


def add_recovery(results: pd.DataFrame) -> pd.DataFrame:
    """Per example, from the base and donor baseline rows of the same model set, template and
    example: ``recovery`` = (grafted - PRE) / (SFT - PRE) of the answer's first-token
    log-probability (the paper's target), ``recovery_answer`` the same of the whole answer's
    teacher-forced log-probability; ``*_gain`` (grafted - PRE) and ``*_gap`` (SFT - PRE) are
    kept for the summary's ratio of means; ``*_small_gap`` flags |SFT - PRE| <
    ``MIN_RECOVERY_GAP``. NaN where a baseline row is missing."""
    out = results.copy()
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

        def lookup(col: str) -> np.ndarray:
            idx = pd.MultiIndex.from_arrays([out[k] for k in key] + [out[col].fillna("")])
            return lp.reindex(idx).to_numpy(dtype=float)

        pre, sft = lookup("base_scheme"), lookup("donor_scheme")
        gain, gap = out[source].to_numpy(dtype=float) - pre, sft - pre
        with np.errstate(divide="ignore", invalid="ignore"):
            out[name] = np.where(np.isfinite(gap), gain / gap, np.nan)
        out[f"{name}_gain"], out[f"{name}_gap"] = gain, gap
        out[f"{name}_small_gap"] = np.abs(gap) < MIN_RECOVERY_GAP
    return out


def ratio_of_means(gain: np.ndarray, gap: np.ndarray, n_boot: int = 1000, seed: int = 0,
                   alpha: float = 0.05) -> tuple[float, float, float, int, str]:
    """``mean(gain) / mean(gap)`` over the examples where both are finite, a paired percentile
    bootstrap interval (examples resampled together), the count, and a note where the number
    is unstable (few examples, a small mean gap, or resamples whose mean gap reaches zero).

    A mean of per-example ratios lets one example with a small gap dominate; the ratio of
    means weighs each example by its gap, which is what "the share of the SFT-PRE difference
    the graft restores" means."""
    ok = np.isfinite(gain) & np.isfinite(gap)
    gain, gap = gain[ok], gap[ok]
    n = int(gain.size)
    if n == 0 or gap.mean() == 0:
        return float("nan"), float("nan"), float("nan"), n, "undefined: no SFT-PRE gap" if n else ""
    value = float(gain.mean() / gap.mean())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    gaps = gap[idx].mean(axis=1)
    crosses = bool((np.sign(gaps) != np.sign(gap.mean())).any() | (gaps == 0).any())
    with np.errstate(divide="ignore", invalid="ignore"):
        boots = gain[idx].mean(axis=1) / gaps
    lo, hi = (float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2)))
    notes = []
    if n < STABLE_N:
        notes.append(f"few examples (n={n})")
    if abs(gap.mean()) < STABLE_MEAN_GAP:
        notes.append(f"small SFT-PRE gap ({gap.mean():.2f} nats)")
    if crosses:
        notes.append("the gap's sign changes under resampling")
    return value, lo, hi, n, ("unstable: " + "; ".join(notes)) if notes else ""


def _mean_ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return float("nan"), float("nan"), float("nan")
    return (float(values.mean()), *bootstrap_ci(values, n_boot, seed))


BEHAVIOUR = ("logit_diff", "kl_donor")


def whole_character_prefix(tokenizer: object, answer_ids: Sequence[int]) -> int:
    """Fewest leading answer tokens that decode to whole characters.

    1 for most answers; more where the first token is a bare UTF-8 byte (Cyrillic, Greek, CJK
    names in byte-level BPE vocabularies), which many answers share, so its rank alone does
    not identify the answer.
    """
    for k in range(1, len(answer_ids) + 1):
        if "\ufffd" not in tokenizer.decode(list(answer_ids[:k])):  # type: ignore[attr-defined]
            return k
    return len(answer_ids)


def bootstrap_ci(values: np.ndarray, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (seeded)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


SUMMARY_KEYS = ["model_set", "template", "scheme"]


def summarize(results: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per (model set, template, direction, scheme): n, top-k rates with 95% CIs,
    ranks, the behaviour metrics (logit difference, KL to the donor) with 95% CIs over the rows
    where they are defined (``n_<metric>``), and ``recovery`` / ``recovery_answer`` as a ratio
    of means with a paired bootstrap CI and a ``*_note`` where the number is unstable.
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
        }
        for k in TOP_K:
            hits = ok[f"top{k}"].to_numpy(dtype=float)
            row[f"top{k}"] = float(hits.mean()) if len(hits) else float("nan")
            if k in (1, 5):
                row[f"top{k}_lo"], row[f"top{k}_hi"] = bootstrap_ci(hits, n_boot, seed)
        ranks = ok["rank"].to_numpy(dtype=float)
        row["mean_rank"] = float(ranks.mean()) if len(ranks) else float("nan")
        row["median_rank"] = float(np.median(ranks)) if len(ranks) else float("nan")
        row["mean_prob"] = float(ok["prob"].mean()) if len(ok) else float("nan")
        row["mean_answer_logprob"] = float(ok["answer_logprob"].mean()) if len(ok) else float("nan")
        for col in BEHAVIOUR:
            if col not in ok.columns:
                continue
            vals = ok[col].to_numpy(dtype=float)
            row[f"mean_{col}"], row[f"{col}_lo"], row[f"{col}_hi"] = _mean_ci(vals, n_boot, seed)
            row[f"n_{col}"] = int(np.isfinite(vals).sum())
        for col in RECOVERY_OF:
            if f"{col}_gain" not in ok.columns:
                continue
            gain, gap = ok[f"{col}_gain"].to_numpy(dtype=float), ok[f"{col}_gap"].to_numpy(dtype=float)
            (row[col], row[f"{col}_lo"], row[f"{col}_hi"], row[f"n_{col}"],
             row[f"{col}_note"]) = ratio_of_means(gain, gap, n_boot, seed)
        row["_order"] = order[scheme]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["model_set", "template", "direction", "_order"]).drop(columns="_order").reset_index(drop=True)
