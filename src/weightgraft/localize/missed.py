"""A bound on what the ranking missed (in the spirit of AtP*): the search takes cells in the
order of their attribution estimates, so a cell with a large effect but a small estimate is
never tried. This draws a random sample of keys below the ranking's cut ``k``, computes each
one's exact single-key effect, and reports the largest (signed, and as a share of the donor's
total effect) and the estimated share of the total ``|effect|`` that lies below rank ``k``:
``N_below * mean|e| (sample below)`` over that plus the mass above ``k`` (all of the top ``k``
exactly where ``k`` is no larger than the sample size, else a sample of the same size, said so),
with a bootstrap interval over the samples. Single-key effects, not the set's interactions.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from weightgraft.localize.verify import CellKey, SetVerifier

BOOTSTRAP = 2000


def missed_seed(seed: int, direction: str, template: str, k: int) -> str:
    """The seed string of the sample below (and above) rank ``k``."""
    return f"{seed}:{direction}:{template}:missed:{k}"


def _draw(keys: Sequence[CellKey], n: int, rng: random.Random) -> tuple[list[CellKey], bool]:
    """All keys where there are at most ``n``, else a random ``n`` (and whether it sampled)."""
    if len(keys) <= n:
        return list(keys), False
    return rng.sample(list(keys), n), True


def missed_bound(verifier: SetVerifier, ranking: Sequence[CellKey], k: int, sample_size: int,
                 seed: int, direction: str, template: str) -> dict[str, Any]:
    """Exact single-key effects of a sample below rank ``k`` (and of the top ``k``, sampled the
    same way where larger), the largest missed effect and the share of ``|effect|`` below ``k``."""
    s = missed_seed(seed, direction, template, k)
    rng = random.Random(s)
    below_all, above_all = list(ranking[k:]), list(ranking[:k])
    below, below_sampled = _draw(below_all, sample_size, rng)
    above, above_sampled = _draw(above_all, sample_size, rng)
    effects = verifier.effects([[key] for key in below + above]).numpy()
    e_below, e_above = effects[: len(below)], effects[len(below):]
    out: dict[str, Any] = {
        "k": k, "seed": s, "n_below": len(below_all), "sample_size": len(below), "below_sampled": below_sampled,
        "n_above": len(above_all), "above_sample_size": len(above), "above_sampled": above_sampled,
        "total_effect": verifier.total,
        "sample": [{"cell": list(key), "effect": float(e)} for key, e in zip(below, e_below)],
        "above": [{"cell": list(key), "effect": float(e)} for key, e in zip(above, e_above)],
    }
    if not len(below):
        return {**out, "largest": None, "share_below_k": 0.0, "ci95": [0.0, 0.0]}
    j = int(np.argmax(np.abs(e_below)))
    out["largest"] = {"cell": list(below[j]), "effect": float(e_below[j]),
                      "share_of_total": float(e_below[j] / verifier.total) if verifier.total else float("nan")}
    out["largest_in_direction"] = float((np.sign(verifier.total) * e_below).max()) if verifier.total else float("nan")

    def share(b: np.ndarray, a: np.ndarray) -> float:
        mass_below = len(below_all) * np.abs(b).mean()
        mass_above = len(above_all) * np.abs(a).mean() if len(a) else 0.0
        whole = mass_below + mass_above
        return float(mass_below / whole) if whole else float("nan")

    out["share_below_k"] = share(e_below, e_above)
    gen = np.random.default_rng(int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little"))

    def resample(e: np.ndarray, sampled: bool) -> np.ndarray:  # a full (unsampled) side is exact
        return gen.choice(e, len(e)) if sampled and len(e) else e

    boot = [share(resample(e_below, below_sampled), resample(e_above, above_sampled)) for _ in range(BOOTSTRAP)]
    out["ci95"] = [float(np.nanpercentile(boot, 2.5)), float(np.nanpercentile(boot, 97.5))]
    return out
