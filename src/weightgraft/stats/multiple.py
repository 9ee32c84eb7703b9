"""Holm's step-down adjustment: one family per run, every test the run prints."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values in the input's order; NaN entries are not tests (left out of the
    family, NaN in the output)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out
