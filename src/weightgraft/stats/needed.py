"""How many prompts an undecided share would need: the observed prompts resampled (seeded) at
larger sizes, and the shipped interval (:func:`~weightgraft.stats.means.share_interval`, the same
rule computed vectorized) read at each, so a report can say "about N prompts" rather than "more"."""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

from weightgraft.stats.means import MIN_N, share_level
from weightgraft.stats.share_rules import fieller, moments

SIZES = (20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640)
POWER = 0.8
SIMS = 400


def prompts_needed(region: np.ndarray, whole: np.ndarray, threshold: float, *, above: bool, sims: int = SIMS,
                   power: float = POWER, sizes: tuple[int, ...] = SIZES, seed: int = 0) -> float:
    """The fewest prompts (of ``sizes``, above the observed count) at which the share's interval
    lies wholly past ``threshold`` on the claim's side in at least ``power`` of ``sims`` seeded
    resamples of the observed prompts (pairs kept together): what the observed effects would need,
    if more prompts were like these. NaN where the observed share is not past the threshold (no
    number of such prompts decides it the claim's way) or where even the largest size does not."""
    r, w = (np.asarray(x, dtype=float).ravel() for x in (region, whole))
    n = len(r)
    if n < MIN_N or float(w.sum()) == 0:
        return float("nan")
    share = float(r.sum() / w.sum())
    if not (share > threshold if above else share < threshold):
        return float("nan")
    rng = np.random.default_rng(seed)
    for m in (s for s in sizes if s > n):
        idx = rng.integers(0, n, size=(sims, m))
        t = sps.t.ppf(0.5 + share_level(0.95) / 2, m - 1)  # the shipped interval: Fieller's bounds at share_level
        low, high = fieller(moments(r[idx], w[idx]), np.asarray(-t), np.asarray(t))
        past = (low > threshold) if above else (high < threshold)
        if float(past.mean()) >= power:
            return float(m)
    return float("nan")
