"""The share designs of docs/statistics.md (D1-D4, and D5-D6 added with issue 66's criterion,
:func:`criterion_designs`) and the first comparison's candidate rules for a share's interval,
compared by the criterion written there first (:func:`compare_share_rules`, :func:`choose_rule`):
what :mod:`weightgraft.stats.simulation` runs and prints."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from weightgraft.stats import means
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
DesignKind = Literal["family", "constant", "linear", "logistic", "carriers", "gamma"]
DESIGN_NUMBERS = {"family": 1, "constant": 2, "linear": 3, "logistic": 4, "carriers": 5, "gamma": 6}
CRITERION_NS = (20, 40, 80)  # the prompts a map the shipped runs use (claims 20, the paper 40, 80)
CARRIER_PROB = 0.2  # D5: P(a prompt carries) = 0.2: at 20 prompts 0.8**20 = 0.012 of samples hold none
CARRIER_SIZE = 12.0  # D5: a carrier's mean whole effect (1 elsewhere): carriers carry 2.4 / 3.2 = 75% of it
CARRIER_OFF_SHARE = 0.05  # D5 "off the carriers": the region's share on a carrier (the rest on the others)


def _gamma_ratio(a: float, shape: float) -> float:
    """The ratio of sums of ``expit(a + w - 1) * w`` over ``w ~ Gamma(shape, 1 / shape)``: weighing
    by ``w`` makes it ``Gamma(shape + 1, 1 / shape)``."""
    from scipy import integrate, special

    law = stats.gamma(shape + 1, scale=1 / shape)
    return float(integrate.quad(lambda w: special.expit(a + w - 1) * law.pdf(w), 0, law.ppf(1 - 1e-13), limit=200)[0])


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
    ``constant`` ``truth``, ``linear`` ``b + 0.15 * z``, ``logistic`` ``expit(a + z)``.
    ``carriers`` (D5): a few prompts carry most of the whole effect (each prompt a carrier with
    probability 0.2, ``w = 12 * exp(0.5 * u - 1/8)``, else ``w = 1 + 0.3 * u``) and the region's share
    is small, ``truth``, placed ``off`` the carriers (0.05 on them, the rest on the others) or ``on``
    them (0 on the others). ``gamma`` (D6): ``w ~ Gamma(shape, 1 / shape)`` (mean 1; shape 1 is the
    exponential) and a share that rises with the effect, ``s = expit(a + w - 1)``."""

    kind: DesignKind
    n: int
    truth: float
    family: str = "normal"
    mu: float = 1.0
    sigma: float = 1.0
    place: str = "off"
    shape: float = 1.0

    @property
    def label(self) -> str:
        if self.kind == "family":
            return f"D1 {self.family}, mu {self.mu:g}"
        if self.kind == "carriers":
            return f"D5 few carry most, region {self.place} them"
        if self.kind == "gamma":
            return f"D6 gamma, shape {self.shape:g}"
        return f"D{DESIGN_NUMBERS[self.kind]} {self.kind}, sigma {self.sigma:g}"

    @functools.cached_property
    def carrier_shares(self) -> tuple[float, float]:
        """D5: the region's share on a carrier and on any other prompt that put the ratio at ``truth``."""
        mass = CARRIER_PROB * CARRIER_SIZE
        if self.place == "on":
            return self.truth * (mass + 1 - CARRIER_PROB) / mass, 0.0
        return CARRIER_OFF_SHARE, (self.truth * (mass + 1 - CARRIER_PROB) - mass * CARRIER_OFF_SHARE) / (1 - CARRIER_PROB)

    @functools.cached_property
    def base(self) -> float:
        """``b`` (linear) or ``a`` (logistic) that puts the true ratio at ``truth``."""
        if self.kind == "linear":
            return self.truth - SLOPE * self.sigma
        if self.kind == "logistic":
            from scipy import optimize

            return float(optimize.brentq(lambda a: _logistic_ratio(a, self.sigma) - self.truth, -30, 30, xtol=1e-12))
        if self.kind == "gamma":
            from scipy import optimize

            return float(optimize.brentq(lambda a: _gamma_ratio(a, self.shape) - self.truth, -40, 40, xtol=1e-12))
        return self.truth

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One sample: ``(region, whole)`` per prompt."""
        if self.kind == "family":
            w = self.mu + noise(self.family, rng, self.n)
            return SHARE * w + 0.3 * noise(self.family, rng, self.n), w
        if self.kind == "carriers":
            carrier = rng.random(self.n) < CARRIER_PROB
            u = rng.standard_normal(self.n)
            w = np.where(carrier, CARRIER_SIZE * np.exp(0.5 * u - 0.125), 1 + 0.3 * u)
            on, off = self.carrier_shares
            return np.where(carrier, on, off) * w + NOISE * rng.standard_normal(self.n), w
        if self.kind == "gamma":
            w = rng.gamma(self.shape, 1 / self.shape, self.n)
            share = 1 / (1 + np.exp(-(self.base + w - 1)))
            return share * w + NOISE * rng.standard_normal(self.n), w
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


def criterion_designs(ns: tuple[int, ...] = CRITERION_NS) -> list[ShareDesign]:
    """Issue 66's designs (docs/statistics.md, fixed before its comparison): D1-D4 and, at each n,
    D5 (region's share 0.1, off the carriers and on them) and D6 (shape 1 and 0.5, ratio 0.25 and 0.5)."""
    out: list[ShareDesign] = []
    for n in ns:
        out += share_designs((n,))
        out += [ShareDesign("carriers", n, 0.1, place=place) for place in ("off", "on")]
        out += [ShareDesign("gamma", n, t, shape=k) for k in (1.0, 0.5) for t in (0.25, 0.5)]
    return out


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
