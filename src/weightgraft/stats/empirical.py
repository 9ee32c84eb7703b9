"""The empirical p-value of one observed value against draws from its null (the found sets'
controls): ``(1 + #null at least as extreme) / (1 + n)``, valid where the observed value and the
draws are exchangeable under the null; its least value is ``1 / (1 + n)``."""

from __future__ import annotations

import numpy as np


def empirical_p(observed: float, null: np.ndarray, above: bool = True) -> float:
    """On the claim's side: draws >= observed (``above``) or <= observed count against it."""
    null = np.asarray(null, dtype=float)
    hits = int((null >= observed).sum()) if above else int((null <= observed).sum())
    return (1 + hits) / (1 + len(null))
