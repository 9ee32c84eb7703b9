"""An estimate of what the ranking missed (in the spirit of AtP*): the search takes cells in the
order of their attribution estimates, so a cell with a large effect but a small estimate is
never tried. This samples keys below the ranking's cut ``k``, stratified by rank (the keys below
the cut in rank order are cut into equal strata, each sampled alike, so that the sample covers
near-misses and the tail alike), computes each one's exact single-key effect, and reports:

- the largest sampled effect (signed, and as a share of the donor's total effect);
- the estimated share of the total ``|effect|`` below rank ``k``: ``N_below * mean|e| (sample
  below)`` over that plus the mass above ``k`` (all of the top ``k`` exactly where ``k`` is no
  larger than the sample size, else a sample of the same size, said so), with a bootstrap
  interval (resampled within strata);
- what the sample rules out at 95% (``rules_out``): for each threshold ``y`` (a fraction of the
  total effect), the one-sided Clopper-Pearson upper bound ``u`` on the fraction of keys below
  the cut whose ``|effect|`` exceeds ``y``: "fewer than u of the cells below the cut have
  |effect| above y". A sample of 64 with no such cell rules out 4.6% and more, not rare cells.

Single-key effects, not the set's interactions.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from weightgraft.localization.verify import CellKey, SetVerifier

BOOTSTRAP = 2000
STRATA = 8
THRESHOLDS = (0.01, 0.05)  # |effect| thresholds, as fractions of the donor's total effect
LEVEL = 0.95


def missed_seed(seed: int, direction: str, template: str, k: int) -> str:
    """The seed string of the sample below (and above) rank ``k``."""
    return f"{seed}:{direction}:{template}:missed:{k}"


def binomial_upper(hits: int, n: int, level: float = LEVEL) -> float:
    """One-sided Clopper-Pearson upper bound on a proportion after ``hits`` of ``n``."""
    if n == 0:
        return 1.0
    if hits >= n:
        return 1.0

    def cdf(p: float) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(hits + 1))

    lo, hi = hits / n, 1.0
    for _ in range(100):  # cdf falls in p: find cdf(p) = 1 - level
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - level else (lo, mid)
    return hi


def _strata(n: int, sample_size: int) -> list[range]:
    """Rank ranges of equal size (the last takes the remainder)."""
    count = max(1, min(STRATA, sample_size, n))
    width = n // count
    return [range(i * width, n if i == count - 1 else (i + 1) * width) for i in range(count)]


def _stratified(keys: Sequence[CellKey], n: int, rng: random.Random) -> tuple[list[CellKey], list[int], bool]:
    """All keys where there are at most ``n``, else ``n`` drawn equally from each rank
    stratum (the remainder from the first strata); the stratum of each key, and whether it sampled."""
    if len(keys) <= n:
        return list(keys), [0] * len(keys), False
    strata = _strata(len(keys), n)
    per = [n // len(strata) + (1 if i < n % len(strata) else 0) for i in range(len(strata))]
    out, which = [], []
    for i, (r, m) in enumerate(zip(strata, per)):
        picked = rng.sample(list(r), min(m, len(r)))
        out += [keys[j] for j in sorted(picked)]
        which += [i] * len(picked)
    return out, which, True


class RuledOut(TypedDict):
    """What a missed-effects sample rules out at one threshold (a share of the total effect)."""

    threshold_share_of_total: float
    threshold: float
    sampled: int
    above: int
    fraction_upper95: float
    statement: str


def rules_out(effects: np.ndarray, total: float, n_below: int) -> list[RuledOut]:
    """Per threshold: how many sampled keys exceed it and the 95% upper bound on their fraction."""
    out: list[RuledOut] = []
    for f in THRESHOLDS:
        y = abs(total) * f
        hits = int((np.abs(effects) > y).sum())
        upper = binomial_upper(hits, len(effects)) if len(effects) < n_below else hits / max(n_below, 1)
        statement = (f"fewer than {upper:.1%} of the {n_below} cells below the cut have |effect| above "
                     f"{y:.3g} ({f:.0%} of the total effect)" if len(effects) < n_below else
                     f"{hits} of the {n_below} cells below the cut have |effect| above {y:.3g} (all measured)")
        out.append(RuledOut(threshold_share_of_total=f, threshold=y, sampled=len(effects), above=hits,
                            fraction_upper95=upper, statement=statement))
    return out


def missed_estimate(verifier: SetVerifier, ranking: Sequence[CellKey], k: int, *, sample_size: int,
                    seed: int, direction: str, template: str) -> dict[str, Any]:
    """Exact single-key effects of a rank-stratified sample below rank ``k`` (and of the top
    ``k``, sampled the same way where larger): the largest missed effect, the share of
    ``|effect|`` below ``k`` and what the sample rules out."""
    s = missed_seed(seed, direction, template, k)
    rng = random.Random(s)
    below_all, above_all = list(ranking[k:]), list(ranking[:k])
    below, strata, below_sampled = _stratified(below_all, sample_size, rng)
    above, _, above_sampled = _stratified(above_all, sample_size, rng)
    effects = verifier.effects([[key] for key in below + above]).numpy()
    e_below, e_above = effects[: len(below)], effects[len(below):]
    out: dict[str, Any] = {
        "k": k, "seed": s, "n_below": len(below_all), "sample_size": len(below), "below_sampled": below_sampled,
        "sampling": f"stratified by rank ({len(set(strata))} strata below the cut)" if below_sampled else "all",
        "n_above": len(above_all), "above_sample_size": len(above), "above_sampled": above_sampled,
        "total_effect": verifier.total,
        "sample": [{"cell": list(key), "effect": float(e), "stratum": st} for key, e, st in zip(below, e_below, strata)],
        "above": [{"cell": list(key), "effect": float(e)} for key, e in zip(above, e_above)],
    }
    if not len(below):
        return {**out, "largest": None, "share_below_k": 0.0, "ci95": [0.0, 0.0], "rules_out": []}
    j = int(np.argmax(np.abs(e_below)))
    out["largest"] = {"cell": list(below[j]), "effect": float(e_below[j]),
                      "share_of_total": float(e_below[j] / verifier.total) if verifier.total else float("nan")}
    out["largest_in_direction"] = float((np.sign(verifier.total) * e_below).max()) if verifier.total else float("nan")
    out["rules_out"] = rules_out(e_below, verifier.total, len(below_all)) if verifier.total else []

    def share(b: np.ndarray, a: np.ndarray) -> float:
        mass_below = len(below_all) * np.abs(b).mean()
        mass_above = len(above_all) * np.abs(a).mean() if len(a) else 0.0
        whole = mass_below + mass_above
        return float(mass_below / whole) if whole else float("nan")

    out["share_below_k"] = share(e_below, e_above)
    gen = np.random.default_rng(int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little"))
    groups = [np.flatnonzero(np.asarray(strata) == g) for g in sorted(set(strata))]

    def resample_below() -> np.ndarray:  # within strata; a full (unsampled) side is exact
        if not below_sampled:
            return e_below
        return np.concatenate([e_below[gen.choice(g, len(g))] for g in groups])

    def resample_above() -> np.ndarray:
        return gen.choice(e_above, len(e_above)) if above_sampled and len(e_above) else e_above

    boot = [share(resample_below(), resample_above()) for _ in range(BOOTSTRAP)]
    out["ci95"] = [float(np.nanpercentile(boot, 2.5)), float(np.nanpercentile(boot, 97.5))]
    return out
