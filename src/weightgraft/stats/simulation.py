"""The seeded simulations that hold :mod:`weightgraft.stats` to its coverage and error rates
(run by the suite, and by ``python -m weightgraft.stats.simulation`` for docs/statistics.md).

Effects per prompt: a whole effect ``w = mu + e1`` and a region effect ``r = share * w + 0.3 * e2``
with ``e1, e2`` of mean 0 and sd 1 from one family (normal, lognormal with sigma 1, its mirror
image, Student t with 3 degrees of freedom); ``mu = 1`` (an effect a prompt sample can see) or
``mu = 0.2`` (a denominator near 0). A true null for the paired test: per prompt a shared
prompt effect plus the family's noise, for the region and for each of its null draws alike.
"""

from __future__ import annotations

import functools

import numpy as np

from weightgraft.stats.means import share_interval
from weightgraft.stats.paired import paired_p
from weightgraft.stats.rates import paired_table_ci, rate_ci

FAMILIES = ("normal", "lognormal", "mirrored lognormal", "t3")
SHARE = 0.3


def noise(family: str, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
    """Draws of mean 0 and sd 1."""
    if family == "normal":
        return rng.standard_normal(size)
    if family in ("lognormal", "mirrored lognormal"):
        x = (rng.lognormal(0.0, 1.0, size) - np.exp(0.5)) / np.sqrt((np.e - 1) * np.e)
        return x if family == "lognormal" else -x
    if family == "t3":
        return rng.standard_t(3, size) / np.sqrt(3.0)
    raise ValueError(f"unknown family {family!r}")


def share_coverage(family: str, n: int, mu: float, sims: int, seed: int = 0) -> dict[str, float]:
    """Of ``sims`` samples: the share of intervals given that cover the true share, the share
    declined, and the share that cover or decline."""
    rng = np.random.default_rng(seed)
    covered = declined = 0
    for _ in range(sims):
        w = mu + noise(family, rng, n)
        r = SHARE * w + 0.3 * noise(family, rng, n)
        iv = share_interval(r, w)
        if iv.declined:
            declined += 1
        elif iv.low <= SHARE <= iv.high:
            covered += 1
    given = sims - declined
    return {"coverage_given": covered / given if given else float("nan"), "given": given,
            "declined": declined / sims, "covered_or_declined": (covered + declined) / sims}


def null_rejection(family: str, n: int, sims: int, *, draws: int = 20, alpha: float = 0.05, seed: int = 0,
                   n_resamples: int = 999, one_draw_null: bool = False) -> float:
    """How often :func:`paired_p` rejects at ``alpha`` when the region is one more random
    region (``draws`` null draws per prompt; ``one_draw_null``: a 1-D null of one draw each)."""
    rng = np.random.default_rng(seed)
    rejected = 0
    for i in range(sims):
        prompt = 3.0 * rng.standard_normal((n, 1))
        k = 1 if one_draw_null else draws
        null = prompt + noise(family, rng, (n, k))
        region = prompt[:, 0] + noise(family, rng, n)
        p = paired_p(region, null[:, 0] if one_draw_null else null, seed=i, n_resamples=n_resamples)
        rejected += p <= alpha
    return rejected / sims


def sign_rejection(family: str, n: int, sims: int, alpha: float = 0.05, seed: int = 0) -> float:
    """How often :func:`sign_test_p` rejects at ``alpha`` on differences of median 0."""
    from weightgraft.stats.signs import sign_test_p

    median = float(np.median(noise(family, np.random.default_rng(99), 200_000)))
    rows = noise(family, np.random.default_rng(seed), (sims, n)) - median
    return float(np.mean([sign_test_p(row) <= alpha for row in rows]))


def rate_coverage(n: int, rate: float) -> float:
    """The exact coverage of :func:`rate_ci` at a true ``rate`` (a sum over the binomial)."""
    from scipy import stats as sps

    pmf = sps.binom.pmf(np.arange(n + 1), n, rate)
    hit = [(lambda lo_hi: lo_hi[0] <= rate <= lo_hi[1])(rate_ci(k, n)[1:]) for k in range(n + 1)]
    return float(pmf[np.array(hit)].sum())


@functools.lru_cache(maxsize=8)
def _paired_tables(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every 2x2 table of ``n`` prompts (both, a only, b only, neither) and its interval."""
    tables = np.array([(k11, k10, k01, n - k11 - k10 - k01) for k11 in range(n + 1) for k10 in range(n + 1 - k11)
                       for k01 in range(n + 1 - k11 - k10)])
    bounds = np.array([paired_table_ci(*map(int, t))[1:] for t in tables])
    return tables, bounds[:, 0], bounds[:, 1]


def paired_difference_coverage(n: int, rate_a: float, rate_b: float, both: float) -> float:
    """The exact coverage of :func:`paired_table_ci` of ``rate_a - rate_b`` when each prompt is
    hit by both schemes with probability ``both`` (a sum over the multinomial's tables)."""
    from scipy import stats as sps

    probs = np.array([both, rate_a - both, rate_b - both, 1 - rate_a - rate_b + both])
    if probs.min() < -1e-12:
        raise ValueError(f"no joint law has rates {rate_a}, {rate_b} and both {both}")
    tables, low, high = _paired_tables(n)
    mass = sps.multinomial(n, np.clip(probs, 0.0, 1.0)).pmf(tables)
    truth = rate_a - rate_b
    return float(mass[(low - 1e-12 <= truth) & (truth <= high + 1e-12)].sum())


# (rate_a, rate_b, both): independent schemes (both = rate_a * rate_b) and schemes whose hits
# nest (both near min(rate_a, rate_b)), at the rates the paper's component figures show
PAIRED_SETTINGS = ((0.3, 0.25, 0.075), (0.3, 0.25, 0.24), (0.225, 0.175, 0.039), (0.225, 0.175, 0.16),
                   (0.5, 0.3, 0.15), (0.5, 0.3, 0.28), (0.1, 0.05, 0.005), (0.1, 0.05, 0.04), (0.05, 0.05, 0.0025),
                   (0.9, 0.8, 0.72), (0.9, 0.8, 0.78))


def _table(header: list[str], right: int, rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * (len(header) - right) + "---:|" * right)
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def main() -> None:  # pragma: no cover - prints docs/statistics.md's tables
    shares = []
    for mu in (1.0, 0.2):
        for family in FAMILIES:
            for n in (8, 20, 40):
                c = share_coverage(family, n, mu, 2000)
                shares.append([family, str(n), str(mu), f"{c['coverage_given']:.3f} ({c['given']})",
                               f"{c['declined']:.3f}", f"{c['covered_or_declined']:.3f}"])
    _table(["family", "n", "mu", "covers (given)", "declined", "covers or declines"], 5, shares)
    cells = [(family, n) for family in FAMILIES for n in (8, 20, 40)]
    _table(["family", "n", "rejects (20 draws per prompt)", "rejects (one-draw 1-D null, sign flip only)"], 3,
           [[f, str(n), f"{null_rejection(f, n, 2000):.3f}", f"{null_rejection(f, n, 2000, one_draw_null=True):.3f}"]
            for f, n in cells])
    _table(["family", "n", "the sign test rejects (median 0)"], 2,
           [[f, str(n), f"{sign_rejection(f, n, 2000):.3f}"] for f, n in cells])
    _table(["n", "least coverage of the rate interval over true rates 0.01-0.99"], 2,
           [[str(n), f"{min(rate_coverage(n, p) for p in np.linspace(0.01, 0.99, 99)):.3f}"] for n in (6, 20, 40)])
    _table(["rate a", "rate b", "both", *(f"coverage at n = {n}" for n in (20, 40, 80))], 6,
           [[f"{a:g}", f"{b:g}", f"{both:g}", *(f"{paired_difference_coverage(n, a, b, both):.3f}" for n in (20, 40, 80))]
            for a, b, both in PAIRED_SETTINGS])


if __name__ == "__main__":  # pragma: no cover
    main()
