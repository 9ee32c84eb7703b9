"""Top-k rates with Clopper-Pearson intervals: never narrower than their coverage allows (6 of 6
hits is 100 [54, 100], not [100, 100]); the difference of two rates on the same prompts with
Newcombe's paired interval."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps


def rate_ci(successes: int, n: int, *, level: float = 0.95) -> tuple[float, float, float]:
    """``(rate, low, high)``: the exact (Clopper-Pearson) interval, coverage >= ``level`` for
    every true rate; NaN with no trials."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"rate_ci: {successes} successes of {n} trials")
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    ci = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="exact")
    return successes / n, float(ci.low), float(ci.high)


def rate_cis(hits: Sequence[bool] | np.ndarray, *, level: float = 0.95) -> tuple[float, float, float]:
    """:func:`rate_ci` of a vector of hits (booleans or 0/1)."""
    x = np.asarray(hits, dtype=float)
    if x.size and not np.isin(x, (0.0, 1.0)).all():
        raise ValueError("rate_cis: hits must be 0 or 1")
    return rate_ci(int(x.sum()), int(x.size), level=level)


@functools.lru_cache(maxsize=4096)
def _wilson(successes: int, n: int, level: float) -> tuple[float, float]:
    ci = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def paired_table_ci(both: int, a_only: int, b_only: int, neither: int, *,
                    level: float = 0.95) -> tuple[float, float, float]:
    """:func:`paired_rate_difference_ci` from the 2x2 table of the prompts (hit by both, by
    ``a`` only, by ``b`` only, by neither)."""
    n = both + a_only + b_only + neither
    if min(both, a_only, b_only, neither) < 0:
        raise ValueError("paired_table_ci: counts must be >= 0")
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    p_a, p_b = (both + a_only) / n, (both + b_only) / n
    lo_a, hi_a = _wilson(both + a_only, n, level)
    lo_b, hi_b = _wilson(both + b_only, n, level)
    margins = (both + a_only) * (b_only + neither) * (both + b_only) * (a_only + neither)
    cross = float(both * neither - a_only * b_only)
    if cross > 0:  # Newcombe's continuity correction of the correlation (his method 10)
        cross = max(cross - n / 2, 0.0)
    phi = cross / math.sqrt(margins) if margins else 0.0
    diff = p_a - p_b
    low = diff - math.sqrt(max(0.0, (p_a - lo_a) ** 2 - 2 * phi * (p_a - lo_a) * (hi_b - p_b) + (hi_b - p_b) ** 2))
    high = diff + math.sqrt(max(0.0, (hi_a - p_a) ** 2 - 2 * phi * (hi_a - p_a) * (p_b - lo_b) + (p_b - lo_b) ** 2))
    return diff, max(low, -1.0), min(high, 1.0)


def paired_rate_difference_ci(hits_a: Sequence[bool] | np.ndarray, hits_b: Sequence[bool] | np.ndarray, *,
                              level: float = 0.95) -> tuple[float, float, float]:
    """``(rate_a - rate_b, low, high)`` of two top-k rates on the same prompts (scheme ``a``
    against scheme ``b``): Newcombe's hybrid score interval for paired proportions, from the
    two rates' Wilson intervals and their correlation (continuity-corrected). Its exact coverage
    at 20-80 prompts is in docs/statistics.md; NaN with no prompt."""
    a, b = np.asarray(hits_a, dtype=float), np.asarray(hits_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_rate_difference_ci: hits of the same prompts, got shapes {a.shape} and {b.shape}")
    if a.size and not (np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all()):
        raise ValueError("paired_rate_difference_ci: hits must be 0 or 1")
    both, a_only = int(((a == 1) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())
    b_only, neither = int(((a == 0) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())
    return paired_table_ci(both, a_only, b_only, neither, level=level)
