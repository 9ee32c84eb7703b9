"""Means and shares over prompts with intervals that keep their coverage, or decline and say why.

A share is ``sum(region) / sum(whole)`` over the same prompts (paired). Its interval is Fieller's:
the values of ``theta`` at which a t test does not reject ``mean(region - theta * whole) = 0``.
It is exact for normal effects at any n, and it is unbounded (declined) exactly when the whole
effect's own t interval includes 0, so a share of a denominator that may be 0 gets no interval.

Heavy skew breaks every t-based interval at these sample sizes (a lognormal effect with sigma 1
covers about 85% at n = 40). An interval is therefore declined where the sample skewness ``g``
of the whole effect or of the share's residuals ``region - share * whole`` is too large for n:
``n < SKEW_FACTOR * g**2`` (Cochran's rule of thumb for the normal approximation of a mean,
with the factor the simulations chose: ``tests/test_stats.py``, docs/statistics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

SKEW_FACTOR = 8.0
MIN_N = 3


@dataclass(frozen=True)
class Interval:
    """An estimate and its interval; ``declined`` says why the bounds are NaN ('' where not)."""

    value: float
    low: float
    high: float
    declined: str = ""

    def as_tuple(self) -> tuple[float, float, float]:
        return self.value, self.low, self.high


def _skew(x: np.ndarray) -> float:
    x = x - x.mean()
    m2 = float((x * x).mean())
    if m2 <= 1e-30 * max(1.0, float(np.abs(x).max(initial=0.0))) ** 2:
        return 0.0
    return float((x ** 3).mean() / m2 ** 1.5)


def _too_skewed(n: int, *series: np.ndarray) -> str:
    g = max(abs(_skew(s)) for s in series)
    if n < SKEW_FACTOR * g * g:
        return (f"effects too skewed for {n} prompts (skewness {g:.2f}; an interval needs n >= "
                f"{math.ceil(SKEW_FACTOR * g * g)})")
    return ""


def _arrays(*values: np.ndarray) -> list[np.ndarray]:
    out = [np.asarray(v, dtype=float).ravel() for v in values]
    if len({len(v) for v in out}) != 1:
        raise ValueError(f"per-prompt effects of unequal length: {[len(v) for v in out]}")
    for v in out:
        if not np.isfinite(v).all():
            raise ValueError("per-prompt effects must be finite")
    return out


def _t(n: int, level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return float(sps.t.ppf(0.5 + level / 2, n - 1))


def mean_interval(values: np.ndarray, *, level: float = 0.95) -> Interval:
    """The mean over prompts and its t interval, declined with fewer than 3 prompts or effects
    too skewed for their number."""
    (x,) = _arrays(values)
    n = len(x)
    mean = float(x.mean()) if n else float("nan")
    if n < MIN_N:
        return Interval(mean, float("nan"), float("nan"), f"fewer than {MIN_N} prompts")
    why = _too_skewed(n, x)
    if why:
        return Interval(mean, float("nan"), float("nan"), why)
    half = _t(n, level) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


def mean_ci(values: np.ndarray, *, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of :func:`mean_interval` (NaN bounds where it declines)."""
    return mean_interval(values, level=level).as_tuple()


def share_interval(region: np.ndarray, whole: np.ndarray, *, level: float = 0.95) -> Interval:
    """``sum(region) / sum(whole)`` over prompts (paired: index i is one prompt in both) and its
    Fieller interval; declined (NaN bounds, reason given) with fewer than 3 prompts, where the
    whole effect's interval includes 0, or where the effects are too skewed for their number."""
    r, w = _arrays(region, whole)
    n = len(r)
    total = float(w.sum())
    share = float(r.sum() / total) if total != 0 else float("nan")
    if n < MIN_N:
        return Interval(share, float("nan"), float("nan"), f"fewer than {MIN_N} prompts")
    t = _t(n, level)
    mr, mw = float(r.mean()), float(w.mean())
    cov = np.cov(np.stack([r, w]), ddof=1) / n
    vrr, vww, vrw = float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])
    a = mw * mw - t * t * vww
    if a <= 0:
        return Interval(share, float("nan"), float("nan"),
                        "the whole effect's interval includes 0 (a share of it has no bounded interval)")
    why = _too_skewed(n, w, r - share * w)
    if why:
        return Interval(share, float("nan"), float("nan"), why)
    b = mr * mw - t * t * vrw
    c = mr * mr - t * t * vrr
    root = math.sqrt(max(b * b - a * c, 0.0))
    return Interval(share, (b - root) / a, (b + root) / a)


def share_ci(region: np.ndarray, whole: np.ndarray, *, level: float = 0.95) -> tuple[float, float, float]:
    """``(share, low, high)`` of :func:`share_interval`: NaN bounds where no interval keeps its
    coverage (:func:`share_interval` says which reason). Analytic: nothing is drawn, no seed."""
    return share_interval(region, whole, level=level).as_tuple()
