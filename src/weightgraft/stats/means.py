"""Means and shares over prompts with intervals, declined where they cannot be given, with the reason.

A share is ``sum(region) / sum(whole)`` over the same prompts (paired). Its interval is Fieller's:
the values of ``theta`` at which a t test does not reject ``mean(region - theta * whole) = 0``.
It is exact for normal effects at any n, and it is unbounded (declined) exactly when the whole
effect's own t interval includes 0, so a share of a denominator that may be 0 gets no interval.

The level: the interval printed as 95% is Fieller's at ``1 - (1 - level) / SHARE_WIDENING``
(99.99999% for 95%), on every sample. Of the rules docs/statistics.md compared by a criterion
fixed before the comparison (each one-sided miss rate, over the intervals given, at most 2.5% plus
three Monte Carlo errors, on every one of 114 designs at 20, 40 and 80 prompts, including effects
whose ratio rests on a few large prompts), the Fieller intervals from 99.999% on pass; the p
:func:`share_threshold_p` inverts keeps its error rate at 0.05, 0.01 and 0.05 / 26 (the first
step of Holm over 26 judged rows, more than either shipped paper run has) on every design from
this widening on, and not below it. So
"95%" is the level held on those designs, which is what a row prints; on normal effects the
coverage is far higher, and a share whose whole effect is not told from 0 at the wider level is
declined (undecided): a row pays in width and declines for never holding falsely on those designs.

A mean's t interval is declined where ``n < SKEW_FACTOR * g**2`` (Cochran's rule of thumb for the
normal approximation of a mean); that rule was not re-chosen by the share's criterion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

SKEW_FACTOR = 8.0
SHARE_WIDENING = 500_000.0  # docs/statistics.md, "The rule adopted": 95% -> Fieller at 99.99999%
MIN_N = 3


@dataclass(frozen=True)
class Interval:
    """An estimate and its interval; ``declined`` says why the bounds are NaN ('' where not).
    ``level`` is the level the bounds were computed at (or would have been, where declined), so a
    table can print it rather than assume the level asked for; ``widened`` says why it is wider
    than asked ('' where it is not)."""

    value: float
    low: float
    high: float
    declined: str = ""
    level: float = 0.95
    widened: str = ""

    def as_tuple(self) -> tuple[float, float, float]:
        return self.value, self.low, self.high


def level_text(level: float | None) -> str:
    """An interval's level as a table prints it (``95%``), or "level not recorded" where a row
    written before the level was kept has none: asserting the usual 95% could be wrong."""
    if level is None or not math.isfinite(float(level)):
        return "level not recorded"
    return f"{100 * float(level):.10g}%"  # 99.99999%, not 100%


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


def _moments(r: np.ndarray, w: np.ndarray) -> tuple[float, float, float, float, float]:
    """Means of region and whole and the covariance of those means, the whole's mean made >= 0
    (both negated: the ratio is the same)."""
    n = len(r)
    if w.mean() < 0:
        r, w = -r, -w
    cov = np.cov(np.stack([r, w]), ddof=1) / n
    return float(r.mean()), float(w.mean()), float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])


def _root(moments: tuple[float, float, float, float, float], c: float, upper: bool) -> float:
    """The smaller (larger where ``upper``) theta with ``(mr - theta * mw)**2 = c**2 * var``."""
    mr, mw, vrr, vww, vrw = moments
    a = mw * mw - c * c * vww
    if a <= 0:
        return float("nan")
    b = mr * mw - c * c * vrw
    root = math.sqrt(max(b * b - a * (mr * mr - c * c * vrr), 0.0))
    return (b + root) / a if upper else (b - root) / a


def _fieller_bounds(r: np.ndarray, w: np.ndarray, q_low: float, q_high: float) -> tuple[float, float]:
    """The thetas where the pivot ``T = mean(r - theta * w) / se`` lies in ``[q_low, q_high]``:
    Fieller's interval at ``q = -t, t``, the bootstrap-t interval at its bootstrap quantiles; NaN
    where unbounded (the whole's mean is not told from 0 at that quantile)."""
    m = _moments(r, w)
    low = _root(m, abs(q_high), upper=q_high < 0)
    high = _root(m, abs(q_low), upper=q_low <= 0)
    return low, high


def mean_interval(values: np.ndarray, *, level: float = 0.95) -> Interval:
    """The mean over prompts and its t interval, declined with fewer than 3 prompts or effects
    too skewed for their number."""
    (x,) = _arrays(values)
    n = len(x)
    mean = float(x.mean()) if n else float("nan")
    if n < MIN_N:
        return Interval(mean, float("nan"), float("nan"), f"fewer than {MIN_N} prompts", level)
    why = _too_skewed(n, x)
    if why:
        return Interval(mean, float("nan"), float("nan"), why, level)
    half = _t(n, level) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, level=level)


def mean_ci(values: np.ndarray, *, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of :func:`mean_interval` (NaN bounds where it declines)."""
    return mean_interval(values, level=level).as_tuple()


def share_level(level: float) -> float:
    """The level Fieller's bounds are computed at for an interval held at ``level`` on every
    design of docs/statistics.md: ``1 - (1 - level) / SHARE_WIDENING``."""
    return 1 - (1 - level) / SHARE_WIDENING


def share_interval(region: np.ndarray, whole: np.ndarray, *, level: float = 0.95) -> Interval:
    """``sum(region) / sum(whole)`` over prompts (paired: index i is one prompt in both) and its
    interval at ``level``: Fieller's bounds at :func:`share_level` (99.99999% for 95%), the rule
    docs/statistics.md adopted by its criterion. Declined (NaN bounds, reason given) with fewer
    than 3 prompts, or where the whole effect's interval at that wider level includes 0. The
    result's ``level`` is the level held on the designs; ``widened`` names the level its bounds
    were computed at."""
    r, w = _arrays(region, whole)
    n = len(r)
    total = float(w.sum())
    share = float(r.sum() / total) if total != 0 else float("nan")
    nan = float("nan")
    wide = share_level(level)
    widened = f"Fieller's bounds at {level_text(wide)}"
    if n < MIN_N:
        return Interval(share, nan, nan, f"fewer than {MIN_N} prompts", level, widened)
    t = _t(n, wide)
    if w.mean() ** 2 - t * t * w.var(ddof=1) / n <= 0:
        return Interval(share, nan, nan, f"the whole effect's interval at {level_text(wide)} includes 0 "
                                         f"(a share of it has no bounded interval)", level, widened)
    low, high = _fieller_bounds(r, w, -t, t)
    return Interval(share, low, high, level=level, widened=widened)


def share_threshold_p(region: np.ndarray, whole: np.ndarray, threshold: float, *, above: bool) -> float:
    """The p of "the share lies past ``threshold`` on the claim's side" that agrees with
    :func:`share_interval`: p <= 1 - level exactly where its interval at that level lies wholly
    past the threshold. Fieller's interval is the set of thresholds t its pivot ``mean(region -
    t * whole) / se`` does not reject, so the p is the pivot's one-sided t p at the threshold,
    doubled (the interval's two sides) and multiplied by ``SHARE_WIDENING`` (the interval's bounds
    are at ``1 - (1 - level) / SHARE_WIDENING``). NaN with fewer than 3 prompts."""
    r, w = _arrays(region, whole)
    n = len(r)
    if n < MIN_N or float(w.sum()) == 0:
        return float("nan")
    if w.mean() < 0:  # the share of a negative whole: both negated, the same ratio
        r, w = -r, -w
    d = r - threshold * w
    sd = float(d.std(ddof=1))
    side = 1.0 if above else -1.0
    if sd == 0:
        one = 0.0 if side * d.mean() > 0 else 1.0
    else:
        one = float(sps.t.sf(side * d.mean() * math.sqrt(n) / sd, n - 1))
    return min(1.0, 2.0 * one * SHARE_WIDENING)


def share_ci(region: np.ndarray, whole: np.ndarray, *, level: float = 0.95) -> tuple[float, float, float]:
    """``(share, low, high)`` of :func:`share_interval`: NaN bounds where no interval keeps its
    coverage (:func:`share_interval` says which reason). Analytic: nothing is drawn, no seed."""
    return share_interval(region, whole, level=level).as_tuple()
