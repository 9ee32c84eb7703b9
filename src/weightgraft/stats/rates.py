"""Top-k rates with Clopper-Pearson intervals: never narrower than their coverage allows (6 of 6
hits is 100 [54, 100], not [100, 100])."""

from __future__ import annotations

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
