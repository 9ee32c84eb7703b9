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
    """One row per (model set, template, scheme): n, top-k rates with 95% CIs, ranks.

    Rows with non-finite logits are counted in ``n_nonfinite`` and left out of every average.
    """
    rows = []
    order = {name: i for i, name in enumerate(dict.fromkeys(results["scheme"]))}
    for (model_set, template, scheme), group in results.groupby(SUMMARY_KEYS, sort=False):
        ok = group[group["finite"]]
        row = {
            "model_set": model_set, "template": template, "scheme": scheme,
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
        row["_order"] = order[scheme]
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.sort_values(["model_set", "template", "_order"]).drop(columns="_order").reset_index(drop=True)
