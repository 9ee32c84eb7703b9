"""Is a region's per-prompt effect larger than its per-prompt null, across prompts?

Two tests, and the p-value is the larger of the two (a region must pass both):

- *sign flip* of the per-prompt differences ``d_i = region_i - mean_j null_ij``: inference about
  prompts beyond these ones (the mean difference over the prompts' population is > 0). Exact
  enumeration of the 2**n sign patterns up to ``EXACT_UP_TO`` prompts, else ``n_resamples``
  seeded patterns. Exact where ``d`` is symmetric under the null; with a one-draw null it is
  conservative for right-skewed differences and too liberal for left-skewed ones (simulated).
- *exchange within prompts* (where ``null`` has draws per prompt): ``n_resamples`` seeded
  relabelings of all prompts at once, each picking which of a prompt's ``1 + K`` values is the
  region's. Exact when, under the null, the region's per-prompt effect and its null draws are
  exchangeable on every prompt (the region is one more random region: the same distribution, not
  merely the same mean), whatever that distribution; it then covers the left-skewed case the sign
  flip does not. A region with its draws' mean but another distribution is not that null: a
  lognormal-skewed region with twice its normal draws' sd is rejected at 0.05 in 0.14-0.20 of
  samples by the relabeling alone, and in 0.15-0.17 by the larger p of the two on the side of
  the region's short tail (20 and 40 prompts; docs/statistics.md).

The least reachable p is :func:`least_p`: a family of m tests needs ``m * least_p <= alpha``.
"""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np

EXACT_UP_TO = 16
N_RESAMPLES = 9999
Alternative = Literal["greater", "less"]


def _patterns(n: int, n_resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    if n <= EXACT_UP_TO:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n))), True
    return rng.choice((1.0, -1.0), size=(n_resamples, n)), False


def _sign_flip_p(d: np.ndarray, n_resamples: int, rng: np.random.Generator) -> float:
    signs, exact = _patterns(len(d), n_resamples, rng)
    observed = d.mean()
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    hits = int(((signs @ d) / len(d) >= observed - tol).sum())
    return hits / len(signs) if exact else (1 + hits) / (1 + len(signs))


def _exchange_p(values: np.ndarray, n_resamples: int, rng: np.random.Generator) -> float:
    """``values``: [prompts, 1 + K], column 0 the region."""
    n, width = values.shape
    k = width - 1
    totals = values.sum(1)

    def stat(pick: np.ndarray) -> np.ndarray:
        chosen = values[np.arange(n), pick]
        return (chosen - (totals - chosen) / k).mean(-1)

    observed = float(stat(np.zeros(n, dtype=int)))
    tol = 1e-12 * max(1.0, float(np.abs(values).max()))
    hits = 0
    for start in range(0, n_resamples, 1000):
        picks = rng.integers(0, width, size=(min(1000, n_resamples - start), n))
        hits += int((stat(picks) >= observed - tol).sum())
    return (1 + hits) / (1 + n_resamples)


def paired_p(region: np.ndarray, null: np.ndarray, *, alternative: Alternative = "greater", seed: int = 0,
             n_resamples: int = N_RESAMPLES) -> float:
    """One-sided p that the region's per-prompt effect exceeds (``greater``) or falls below
    (``less``) its null: ``null`` is per-prompt null means (1-D) or ``[prompts, draws]``.
    With draws per prompt, its error rate is at most alpha where, under the null, the region is
    exchangeable with its draws on each prompt (the same distribution, not merely the same mean).
    Seeded: the same inputs give the same p."""
    r = np.asarray(region, dtype=float)
    nul = np.asarray(null, dtype=float)
    if r.ndim != 1 or nul.ndim not in (1, 2) or nul.shape[0] != r.shape[0]:
        raise ValueError(f"paired_p: region [prompts] and null [prompts] or [prompts, draws], got {r.shape}, {nul.shape}")
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    if len(r) == 0 or not (np.isfinite(r).all() and np.isfinite(nul).all()):
        return float("nan")
    sign = 1.0 if alternative == "greater" else -1.0
    rng = np.random.default_rng(seed)
    draws = nul if nul.ndim == 2 else nul[:, None]
    p = _sign_flip_p(sign * (r - draws.mean(1)), n_resamples, rng)
    if nul.ndim == 2 and draws.shape[1] >= 1:
        p = max(p, _exchange_p(sign * np.column_stack([r, draws]), n_resamples, rng))
    return float(p)


def least_p(n_prompts: int, *, n_resamples: int = N_RESAMPLES) -> float:
    """The smallest p :func:`paired_p` can return with ``n_prompts`` prompts (its floor)."""
    if n_prompts < 1:
        return 1.0
    flip = 2.0 ** -n_prompts if n_prompts <= EXACT_UP_TO else 1 / (1 + n_resamples)
    return max(flip, 1 / (1 + n_resamples))
