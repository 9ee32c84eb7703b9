"""The sign test: in how many prompts is a per-prompt difference above 0? Exact (binomial) and
free of any assumption on the differences' distribution beyond independence; it tests their
median, not their mean, so it answers "on most prompts" where skew leaves a mean no interval."""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy import stats as sps


def sign_test_p(differences: np.ndarray, *, alternative: Literal["greater", "less"] = "greater") -> float:
    """One-sided exact p that the differences' median is above (``greater``) or below 0; zeros
    are dropped (no sign); NaN with no nonzero difference."""
    d = np.asarray(differences, dtype=float)
    d = d[d != 0]
    if d.size == 0:
        return float("nan")
    k = int((d > 0).sum()) if alternative == "greater" else int((d < 0).sum())
    return float(sps.binomtest(k, int(d.size), 0.5, alternative="greater").pvalue)
