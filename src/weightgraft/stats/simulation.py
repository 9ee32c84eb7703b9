"""The seeded simulations that hold :mod:`weightgraft.stats` to its coverage and error rates
(run by the suite, and by ``python -m weightgraft.stats.simulation`` for docs/statistics.md).

Shares (:class:`ShareDesign`, D1-D4 of docs/statistics.md): D1 a whole effect ``w = mu + e1`` and
a region effect ``r = 0.3 * w + 0.3 * e2`` with ``e1, e2`` of mean 0 and sd 1 from one family
(normal, lognormal with sigma 1, its mirror image, Student t with 3 degrees of freedom); ``mu = 1``
(an effect a prompt sample can see) or ``mu = 0.2`` (a denominator near 0). D2-D4 a lognormal whole
effect with a constant per-prompt share, or one that grows with the effect's size. The candidate
rules for the share's interval are compared on them by the criterion docs/statistics.md fixed
(:func:`compare_share_rules`, :func:`choose_rule`). A true null for the paired test: per prompt a
shared prompt effect plus the family's noise, for the region and for each of its null draws alike.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from weightgraft.stats import means
from weightgraft.stats.means import share_interval
from weightgraft.stats.paired import Alternative, paired_p
from weightgraft.stats.rates import paired_table_ci, rate_ci
from weightgraft.stats.signs import sign_test_p

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


SHARE_NS = (20, 40)
SKEW_FACTORS = (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0)
METHODS = ("fieller", "bca", "bootstrap-t", "fieller 99% where skewed")
SLOPE = 0.15
NOISE = 0.2
SIGN_ALPHA = 0.025
BOOT_RESAMPLES = 1999
BOOT_SEED = 0
DesignKind = Literal["family", "constant", "linear", "logistic"]
DESIGN_NUMBERS = {"family": 1, "constant": 2, "linear": 3, "logistic": 4}


def _logistic_ratio(a: float, sigma: float) -> float:
    """The ratio of sums of ``expit(a + z) * exp(sigma * z)`` over ``z ~ N(0, 1)``: weighing by
    ``exp(sigma * z)`` shifts z to ``N(sigma, 1)``."""
    from scipy import integrate, special

    return float(integrate.quad(lambda u: special.expit(a + sigma + u) * np.exp(-u * u / 2) / np.sqrt(2 * np.pi),
                                -12, 12)[0])


@dataclass(frozen=True)
class ShareDesign:
    """Per-prompt region and whole effects of known true ratio of sums (docs/statistics.md, D1-D4).

    ``family``: ``w = mu + e1``, ``r = 0.3 * w + 0.3 * e2`` (true ratio 0.3); else ``z ~ N(0, 1)``,
    ``w = exp(sigma * z - sigma**2 / 2)`` and ``r = s * w + 0.2 * eps`` with per-prompt share ``s``:
    ``constant`` ``truth``, ``linear`` ``b + 0.15 * z``, ``logistic`` ``expit(a + z)``."""

    kind: DesignKind
    n: int
    truth: float
    family: str = "normal"
    mu: float = 1.0
    sigma: float = 1.0

    @property
    def label(self) -> str:
        if self.kind == "family":
            return f"D1 {self.family}, mu {self.mu:g}"
        return f"D{DESIGN_NUMBERS[self.kind]} {self.kind}, sigma {self.sigma:g}"

    @functools.cached_property
    def base(self) -> float:
        """``b`` (linear) or ``a`` (logistic) that puts the true ratio at ``truth``."""
        if self.kind == "linear":
            return self.truth - SLOPE * self.sigma
        if self.kind == "logistic":
            from scipy import optimize

            return float(optimize.brentq(lambda a: _logistic_ratio(a, self.sigma) - self.truth, -30, 30, xtol=1e-12))
        return self.truth

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One sample: ``(region, whole)`` per prompt."""
        if self.kind == "family":
            w = self.mu + noise(self.family, rng, self.n)
            return SHARE * w + 0.3 * noise(self.family, rng, self.n), w
        z = rng.standard_normal(self.n)
        w = np.exp(self.sigma * z - self.sigma ** 2 / 2)
        if self.kind == "linear":
            share = self.base + SLOPE * z
        elif self.kind == "logistic":
            share = 1 / (1 + np.exp(-(self.base + z)))
        else:
            share = np.full(self.n, self.base)
        return share * w + NOISE * rng.standard_normal(self.n), w


def share_designs(ns: tuple[int, ...] = SHARE_NS) -> list[ShareDesign]:
    """D1-D4 of docs/statistics.md at each n."""
    out: list[ShareDesign] = []
    for n in ns:
        out += [ShareDesign("family", n, SHARE, family=f, mu=mu) for mu in (1.0, 0.2) for f in FAMILIES]
        for sigma in (0.5, 1.0, 1.5):
            out.append(ShareDesign("constant", n, 0.5, sigma=sigma))
            out += [ShareDesign("linear", n, t, sigma=sigma) for t in (0.0, 0.25, 0.5, 0.8)]
            out += [ShareDesign("logistic", n, t, sigma=sigma) for t in (0.25, 0.5, 0.8)]
    return out


def share_misses(design: ShareDesign, sims: int, seed: int = 0) -> dict[str, float]:
    """:func:`share_interval` on ``sims`` seeded samples of ``design``: of the intervals given, the
    share that cover the true ratio and that miss it on each side, the share declined, and how
    often a ``<`` and a ``>`` claim at the true ratio would hold (on the interval; and with the
    sign test where the note says skew, as the claims' verdicts do)."""
    rng = np.random.default_rng(seed)
    below = above = declined = less = greater = less_sign = greater_sign = 0
    for _ in range(sims):
        r, w = design.draw(rng)
        iv = share_interval(r, w)
        if iv.declined:
            declined += 1
            if iv.declined.startswith("effects too skewed"):
                past = r - design.truth * w
                p_less, p_greater = sign_test_p(past, alternative="less"), sign_test_p(past, alternative="greater")
                less_sign += p_less <= SIGN_ALPHA < p_greater
                greater_sign += p_greater <= SIGN_ALPHA < p_less
            continue
        below += design.truth < iv.low
        above += design.truth > iv.high
        less += iv.high < design.truth
        greater += iv.low > design.truth
    given = sims - declined
    nan = float("nan")
    return {"given": given, "coverage_given": (given - below - above) / given if given else nan,
            "miss_low": below / given if given else nan, "miss_high": above / given if given else nan,
            "declined": declined / sims, "bound": miss_bound(given), "false_less": less / sims,
            "false_greater": greater / sims, "false_less_sign": (less + less_sign) / sims,
            "false_greater_sign": (greater + greater_sign) / sims}


def _resamples(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """Seeded indices of ``n_resamples`` resamples of ``n`` prompts ([n_resamples, n])."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def _bootstrap_t_bounds(r: np.ndarray, w: np.ndarray, level: float, n_resamples: int = BOOT_RESAMPLES,
                        seed: int = BOOT_SEED) -> tuple[float, float]:
    """Fieller's interval with the t quantiles replaced by the bootstrap quantiles of its own pivot
    at the estimate: the pivot's skew, which the t quantiles ignore, sets each side."""
    if w.mean() < 0:
        r, w = -r, -w
    theta = float(r.sum() / w.sum())
    d = (r - theta * w)[_resamples(len(r), n_resamples, seed)]
    sd = d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        pivot = np.where(sd > 0, d.mean(1) * math.sqrt(len(r)) / sd, 0.0)
    q_low, q_high = np.quantile(pivot, [0.5 - level / 2, 0.5 + level / 2])
    return means._fieller_bounds(r, w, float(q_low), float(q_high))


def _bca_bounds(r: np.ndarray, w: np.ndarray, level: float, n_resamples: int = BOOT_RESAMPLES,
                seed: int = BOOT_SEED) -> tuple[float, float]:
    """SciPy's BCa interval of the ratio of sums, prompts resampled in pairs (seeded)."""
    def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return x.sum(axis) / y.sum(axis)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ci = stats.bootstrap((r, w), ratio, paired=True, vectorized=True, n_resamples=n_resamples, method="BCa",
                           confidence_level=level, random_state=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


FIELDS = ("g", "den_declined", "f95_low", "f95_high", "f99_low", "f99_high", "bca_low", "bca_high", "bt_low",
          "bt_high", "sign_p_less", "sign_p_greater")


def share_candidates(region: np.ndarray, whole: np.ndarray, threshold: float) -> np.ndarray:
    """Every candidate rule's pieces on one sample (``FIELDS``): the skewness the decline reads,
    whether the whole effect's interval includes 0, each method's bounds, and the sign test's p
    on each side at ``threshold``."""
    r, w = np.asarray(region, float), np.asarray(whole, float)
    n = len(r)
    share = float(r.sum() / w.sum())
    g = max(abs(means._skew(w)), abs(means._skew(r - share * w)))
    t95, t99 = means._t(n, 0.95), means._t(n, 0.99)
    den_declined = w.mean() ** 2 - t95 * t95 * w.var(ddof=1) / n <= 0
    out = [g, float(den_declined), *means._fieller_bounds(r, w, -t95, t95), *means._fieller_bounds(r, w, -t99, t99)]
    out += [*_bca_bounds(r, w, 0.95), *_bootstrap_t_bounds(r, w, 0.95)] if not den_declined else [np.nan] * 4
    past = r - threshold * w
    out += [sign_test_p(past, alternative="less"), sign_test_p(past, alternative="greater")]
    return np.array(out, dtype=float)


def share_records(design: ShareDesign, sims: int, seed: int) -> np.ndarray:
    """``share_candidates`` of ``sims`` seeded samples of ``design`` at its true ratio ([sims, FIELDS])."""
    rng = np.random.default_rng(seed)
    return np.stack([share_candidates(*design.draw(rng), design.truth) for _ in range(sims)])


def miss_bound(given: int) -> float:
    """The most a one-sided miss rate of a 95% interval may be over ``given`` intervals:
    2.5% plus three Monte Carlo standard errors."""
    return 0.025 + 3 * math.sqrt(0.025 * 0.975 / given) if given else float("inf")


def rule_rates(records: np.ndarray, n: int, truth: float, method: str, factor: float) -> dict[str, float]:
    """One rule on one design's records: coverage, lower and upper miss rates given an interval,
    the decline rate, and how often a ``<`` and a ``>`` claim at ``truth`` hold on the interval
    alone and with the sign test where the rule declines for skew."""
    f = {name: records[:, i] for i, name in enumerate(FIELDS)}
    skewed = n < factor * f["g"] ** 2
    den = f["den_declined"] > 0
    key = {"fieller": "f95", "bca": "bca", "bootstrap-t": "bt", "fieller 99% where skewed": "f95"}[method]
    low, high = f[f"{key}_low"].copy(), f[f"{key}_high"].copy()
    if method == "fieller 99% where skewed":
        low[skewed], high[skewed] = f["f99_low"][skewed], f["f99_high"][skewed]
        skewed = skewed & ~(np.isfinite(low) & np.isfinite(high))
    declined = den | skewed | ~np.isfinite(low) | ~np.isfinite(high)
    given = ~declined
    k = int(given.sum())
    below, above = given & (truth < low), given & (truth > high)
    by_sign = skewed & ~den
    width = (high - low)[given] / (f["f95_high"] - f["f95_low"])[given]
    less = (given & (high < truth)) | (by_sign & (f["sign_p_less"] <= SIGN_ALPHA) & (f["sign_p_greater"] > SIGN_ALPHA))
    greater = (given & (low > truth)) | (by_sign & (f["sign_p_greater"] <= SIGN_ALPHA) & (f["sign_p_less"] > SIGN_ALPHA))
    nan = float("nan")
    return {"given": k, "coverage_given": (k - below.sum() - above.sum()) / k if k else nan,
            "miss_low": below.sum() / k if k else nan, "miss_high": above.sum() / k if k else nan,
            "declined": float(declined.mean()), "bound": miss_bound(k), "width": float(np.median(width)) if k else nan,
            "false_less": float((given & (high < truth)).mean()), "false_greater": float((given & (low > truth)).mean()),
            "false_less_sign": float(less.mean()), "false_greater_sign": float(greater.mean())}


def passes(rates: dict[str, float]) -> bool:
    """Both one-sided miss rates given an interval within :func:`miss_bound` (none given passes)."""
    return not rates["given"] or max(rates["miss_low"], rates["miss_high"]) <= rates["bound"]


def compare_share_rules(sims: int, seed: int, ns: tuple[int, ...] = SHARE_NS
                        ) -> tuple[list[ShareDesign], dict[tuple[str, float], list[dict[str, float]]]]:
    """Every candidate rule (``METHODS`` x ``SKEW_FACTORS``) on every design, ``sims`` samples each,
    design j seeded ``seed + j``: the rates of :func:`rule_rates` per rule, one per design."""
    designs = share_designs(ns)
    records = [share_records(d, sims, seed + j) for j, d in enumerate(designs)]
    return designs, {(m, fac): [rule_rates(rec, d.n, d.truth, m, fac) for d, rec in zip(designs, records)]
                     for m in METHODS for fac in SKEW_FACTORS}


def choose_rule(results: dict[tuple[str, float], list[dict[str, float]]], method: str | None = None) -> tuple[str, float]:
    """The criterion of docs/statistics.md: pass every design, then fewest declines; if none does,
    most designs passed, then the smaller largest excess over the bound, then fewest declines
    (among ``method``'s rules only, where given)."""
    def key(rule: tuple[str, float]) -> tuple[int, float, float]:
        rows = results[rule]
        excess = max((max(r["miss_low"], r["miss_high"]) - r["bound"]) for r in rows if r["given"])
        return -sum(passes(r) for r in rows), max(excess, 0.0), float(np.mean([r["declined"] for r in rows]))

    return min((rule for rule in results if method in (None, rule[0])), key=key)


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


def skewed_region_rejection(n: int, sims: int, *, alternative: Alternative = "greater", region_family: str = "lognormal",
                            region_sd: float = 1.0, draws: int = 20, alpha: float = 0.05, seed: int = 0,
                            n_resamples: int = 999, relabeling_only: bool = False) -> float:
    """How often :func:`paired_p` (or its relabeling test alone) rejects at ``alpha`` when the
    region has its null draws' mean but not their distribution: per prompt a shared prompt effect,
    normal noise (sd 1) for each null draw, ``region_family``'s noise (mean 0, sd ``region_sd``)
    for the region. Not a null the test is exact under: the region is not exchangeable with its draws."""
    from weightgraft.stats.paired import _exchange_p

    rng = np.random.default_rng(seed)
    sign = 1.0 if alternative == "greater" else -1.0
    rejected = 0
    for i in range(sims):
        prompt = 3.0 * rng.standard_normal((n, 1))
        null = prompt + rng.standard_normal((n, draws))
        region = prompt[:, 0] + region_sd * noise(region_family, rng, n)
        if relabeling_only:
            p = _exchange_p(sign * np.column_stack([region, null]), n_resamples, np.random.default_rng(i))
        else:
            p = paired_p(region, null, alternative=alternative, seed=i, n_resamples=n_resamples)
        rejected += p <= alpha
    return rejected / sims


def sign_rejection(family: str, n: int, sims: int, alpha: float = 0.05, seed: int = 0) -> float:
    """How often :func:`sign_test_p` rejects at ``alpha`` on differences of median 0."""
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


def _rule_name(rule: tuple[str, float]) -> str:
    return f"{rule[0]}, f = {rule[1]:g}"


def _rates_row(rates: dict[str, float]) -> list[str]:
    def miss(x: float) -> str:
        return "-" if not rates["given"] else f"{x:.3f}" + ("" if x <= rates["bound"] else " **")

    return [f"{rates['coverage_given']:.3f} ({rates['given']})" if rates["given"] else "- (0)", miss(rates["miss_low"]),
            miss(rates["miss_high"]), f"{rates['bound']:.3f}" if rates["given"] else "-", f"{rates['declined']:.3f}",
            f"{rates['false_less']:.3f}", f"{rates['false_greater']:.3f}", f"{rates['false_less_sign']:.3f}",
            f"{rates['false_greater_sign']:.3f}"]


RATES_HEADER = ["covers (given)", "truth below low", "truth above high", "bound", "declined", "`<` holds", "`>` holds",
                "`<` holds (sign test too)", "`>` holds (sign test too)"]


def share_rules_report(sims: int, seed: int, shown: list[tuple[str, float]],
                       compact: list[tuple[str, float]]) -> None:  # pragma: no cover
    """Prints docs/statistics.md's comparison of the share interval's rules: every rule's summary,
    the one the criterion chooses on this run (overall and per method), per design the rules in
    ``shown`` and those, and the rules in ``compact`` side by side in brief."""
    designs, results = compare_share_rules(sims, seed)
    chosen = choose_rule(results)
    rows = []
    for rule, rates in results.items():
        given = [r for r in rates if r["given"]]
        excess = max(max(r["miss_low"], r["miss_high"]) - r["bound"] for r in given)
        rows.append([rule[0], f"{rule[1]:g}", f"{sum(passes(r) for r in rates)} of {len(rates)}", f"{max(excess, 0):.3f}",
                     f"{np.mean([r['declined'] for r in rates]):.3f}", f"{np.nanmean([r['width'] for r in rates]):.2f}"])
    _table(["method", "f", "designs passed", "largest excess over the bound", "mean declined",
            "width / Fieller 95% (median, mean over designs)"], 4, rows)
    best = [choose_rule(results, m) for m in METHODS]
    print(f"chosen by the criterion on this run (seed {seed}, {sims} samples per design): {_rule_name(chosen)}; "
          f"per method: {'; '.join(_rule_name(b) for b in best)}\n")
    for rule in dict.fromkeys([*shown, chosen, *best]):
        print(f"{_rule_name(rule)}:\n")
        _table(["design", "n", "true ratio", *RATES_HEADER], len(RATES_HEADER) + 1,
               [[d.label, str(d.n), f"{d.truth:g}", *_rates_row(r)] for d, r in zip(designs, results[rule])])
    if compact:
        def brief(r: dict[str, float]) -> list[str]:
            row = _rates_row(r)
            return [f"{row[1]} / {row[2]} ({r['declined']:.2f})", row[7]]

        _table(["design", "n", "true ratio", *(f"{_rule_name(c)}: {x}" for c in compact
                                               for x in ("below / above (declined)", "`<` holds (sign test too)"))],
               2 * len(compact) + 1,
               [[d.label, str(d.n), f"{d.truth:g}", *(x for c in compact for x in brief(results[c][j]))]
                for j, d in enumerate(designs)])


def seeded_share_designs(seed: int) -> list[tuple[ShareDesign, int]]:
    """D1 at n = 8 (seeds ``seed + 100 + j``) and D1-D4 at 20 and 40 (``seed + j``, as in
    :func:`compare_share_rules`, so a run of the shipped rule repeats its samples)."""
    small = [d for d in share_designs((8,)) if d.kind == "family"]
    return [(d, seed + 100 + j) for j, d in enumerate(small)] + [(d, seed + j) for j, d in enumerate(share_designs())]


def adopted_report(sims: int, seed: int) -> None:  # pragma: no cover
    """Prints docs/statistics.md's table of :func:`share_interval` as shipped on D1-D4 (D1 at n = 8 too)."""
    _table(["design", "n", "true ratio", *RATES_HEADER], len(RATES_HEADER) + 1,
           [[d.label, str(d.n), f"{d.truth:g}", *_rates_row(share_misses(d, sims, s))] for d, s in seeded_share_designs(seed)])


def skewed_region_report(sims: int) -> None:  # pragma: no cover
    """Prints docs/statistics.md's table of the paired test on regions with their draws' mean but
    a skewed distribution."""
    rows = []
    for sd in (1.0, 2.0):
        for family in ("lognormal", "mirrored lognormal"):
            for alternative in ("greater", "less"):
                for n in SHARE_NS:
                    rates = [skewed_region_rejection(n, sims, alternative=alternative, region_family=family, region_sd=sd,
                                                     seed=n, relabeling_only=alone) for alone in (True, False)]
                    rows.append([family, f"{sd:g}", alternative, str(n), *(f"{x:.3f}" for x in rates)])
    _table(["region's noise", "its sd", "alternative", "n", "relabeling test alone rejects", "paired_p rejects"], 4, rows)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - prints docs/statistics.md's tables
    import argparse

    parser = argparse.ArgumentParser(prog="python -m weightgraft.stats.simulation",
                                     description="docs/statistics.md's tables (all but --share-rules without a flag)")
    parser.add_argument("--share-rules", action="store_true", help="compare the share interval's candidate rules")
    parser.add_argument("--share", action="store_true", help="only the share interval as shipped")
    parser.add_argument("--skewed-region", action="store_true", help="only the paired test on skewed regions")
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1000, help="the first seed of --share-rules and --share")
    parser.add_argument("--show", action="append", default=[], metavar="METHOD:F",
                        help="with --share-rules, a rule to show per design, e.g. 'fieller:8' (repeatable)")
    parser.add_argument("--compact", action="append", default=[], metavar="METHOD:F",
                        help="with --share-rules, a rule to show per design in brief beside the others (repeatable)")
    args = parser.parse_args(argv)
    if args.share_rules:
        def rules(given: list[str]) -> list[tuple[str, float]]:
            return [(m, float(f)) for m, f in (x.rsplit(":", 1) for x in given)]

        share_rules_report(args.sims, args.seed, rules(args.show), rules(args.compact))
        return
    everything = not (args.share or args.skewed_region)
    if args.share or everything:
        adopted_report(args.sims, args.seed)
    if args.skewed_region or everything:
        skewed_region_report(args.sims)
    if not everything:
        return
    cells = [(family, n) for family in FAMILIES for n in (8, 20, 40)]
    _table(["family", "n", "rejects (20 draws per prompt)", "rejects (one-draw 1-D null, sign flip only)"], 3,
           [[f, str(n), f"{null_rejection(f, n, args.sims):.3f}",
             f"{null_rejection(f, n, args.sims, one_draw_null=True):.3f}"] for f, n in cells])
    _table(["family", "n", "the sign test rejects (median 0)"], 2,
           [[f, str(n), f"{sign_rejection(f, n, args.sims):.3f}"] for f, n in cells])
    _table(["n", "least coverage of the rate interval over true rates 0.01-0.99"], 2,
           [[str(n), f"{min(rate_coverage(n, p) for p in np.linspace(0.01, 0.99, 99)):.3f}"] for n in (6, 20, 40)])
    _table(["rate a", "rate b", "both", *(f"coverage at n = {n}" for n in (20, 40, 80))], 6,
           [[f"{a:g}", f"{b:g}", f"{both:g}", *(f"{paired_difference_coverage(n, a, b, both):.3f}" for n in (20, 40, 80))]
            for a, b, both in PAIRED_SETTINGS])


if __name__ == "__main__":  # pragma: no cover
    main()
