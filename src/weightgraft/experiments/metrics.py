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


# |SFT - PRE| of the answer's log-prob below which recovery is flagged (and left out of means):
# the ratio of two near-equal log-probs says nothing about the graft.
MIN_RECOVERY_GAP = 0.1


def add_recovery(results: pd.DataFrame) -> pd.DataFrame:
    """``recovery`` = (grafted - PRE) / (SFT - PRE) of the answer's log-prob, per example, from
    the base and donor baseline rows of the same model set, template and example; NaN where a
    baseline row is missing; ``recovery_small_gap`` flags |SFT - PRE| < ``MIN_RECOVERY_GAP``."""
    out = results.copy()
    if "base_scheme" not in out.columns:
        out["recovery"], out["recovery_small_gap"] = float("nan"), False
        return out
    key = ["model_set", "template", "example_id"]
    lp = out.set_index([*key, "scheme"])["answer_logprob"]
    lp = lp[~lp.index.duplicated()]

    def lookup(col: str) -> np.ndarray:
        idx = pd.MultiIndex.from_arrays([out[k] for k in key] + [out[col].fillna("")])
        return lp.reindex(idx).to_numpy(dtype=float)

    pre, sft = lookup("base_scheme"), lookup("donor_scheme")
    gap = sft - pre
    with np.errstate(divide="ignore", invalid="ignore"):
        out["recovery"] = (out["answer_logprob"].to_numpy(dtype=float) - pre) / gap
    out["recovery_small_gap"] = np.abs(gap) < MIN_RECOVERY_GAP
    out.loc[~np.isfinite(gap), "recovery"] = float("nan")
    return out


def _mean_ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return float("nan"), float("nan"), float("nan")
    return (float(values.mean()), *bootstrap_ci(values, n_boot, seed))


BEHAVIOUR = ("logit_diff", "kl_donor", "recovery")


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
    ranks, and the behaviour metrics (logit difference, KL to the donor, recovery) with 95% CIs
    over the rows where they are defined (``n_<metric>``; recovery leaves out the small-gap
    rows). ``direction`` (a2b, b2a) is empty for prompts without one.

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
            if col == "recovery" and "recovery_small_gap" in ok.columns:
                row["n_recovery_small_gap"] = int(ok["recovery_small_gap"].fillna(False).astype(bool).sum())
                vals = vals[~ok["recovery_small_gap"].fillna(False).astype(bool).to_numpy()]
            row[f"mean_{col}"], row[f"{col}_lo"], row[f"{col}_hi"] = _mean_ci(vals, n_boot, seed)
            row[f"n_{col}"] = int(np.isfinite(vals).sum())
        row["_order"] = order[scheme]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["model_set", "template", "direction", "_order"]).drop(columns="_order").reset_index(drop=True)
