"""weightgraft.stats: each interval's coverage and each test's error rate, by seeded simulation at
the sample sizes the defaults use (n = 8, 20, 40), held where docs/statistics.md says they hold."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

import weightgraft.stats as st
from weightgraft.stats import means
from weightgraft.stats import share_rules as sr
from weightgraft.stats.share_designs import criterion_designs
from weightgraft.stats.simulation import (
    FAMILIES,
    miss_bound,
    null_rejection,
    rate_coverage,
    skewed_region_rejection,
)

pytestmark = pytest.mark.slow  # `make check` leaves these out: seeded simulations of coverage and error rates

SHARE_SIMS = 2000  # as docs/statistics.md's tables, on the suite's own seeds (from 3000)


def _criterion_params() -> list:
    return [pytest.param(d, 3000 + j, id=f"{d.label}, n {d.n}, ratio {d.truth:g}")
            for j, d in enumerate(criterion_designs())]


@pytest.mark.parametrize(("design", "seed"), _criterion_params())
def test_the_shipped_share_rule_meets_the_criterion_on_every_design(design, seed):
    """docs/statistics.md's criterion on the suite's own run (design j seeded 3000 + j, 2,000
    samples): of the intervals given, the truth lies below the lower bound, and above the upper, at
    most 2.5% plus three Monte Carlo errors of that count; and the threshold p that inverts the
    interval holds a claim at the true ratio falsely, on each side, at most alpha plus three Monte
    Carlo errors at alpha 0.05, 0.01 and 0.05 / 26. A declined interval is never a success. Every
    design, no expected failures (the vectorized rule is ``share_interval`` sample for sample:
    tests/stats/test_share_rules.py)."""
    b = sr.draw_batch(design, SHARE_SIMS, seed)
    r = sr.rates(b, sr.shipped_rule())
    assert sr.passes(r), r
    p = sr.p_rates(b)
    assert sr.p_passes(p), p


def test_miss_bound_is_three_monte_carlo_errors():
    assert miss_bound(2000) == pytest.approx(0.025 + 3 * math.sqrt(0.025 * 0.975 / 2000))
    assert miss_bound(0) == math.inf


def test_share_interval_declines_a_denominator_that_may_be_zero():
    rng = np.random.default_rng(0)
    w = rng.normal(0.0, 1.0, 40)
    iv = st.share_interval(0.3 * w + rng.normal(0, 0.1, 40), w)
    assert math.isnan(iv.low) and math.isnan(iv.high) and "includes 0" in iv.declined
    assert st.share_interval([1.0, 2.0], [1.0, 2.0]).declined == "fewer than 3 prompts"


def _fieller(r: np.ndarray, w: np.ndarray, level: float) -> tuple[float, float]:
    t = means._t(len(r), level)
    return means._fieller_bounds(r, w, -t, t)


def test_share_interval_is_fieller_at_the_wider_level_and_declines_where_that_one_is_unbounded():
    """Every sample gets Fieller's bounds at ``share_level`` (99.99999% for 95%), skewed or not, and
    is declined where the whole effect's interval at that level includes 0, though not at 95%."""
    assert means.share_level(0.95) == pytest.approx(1 - 1e-7)
    x = np.array([10.0] * 19 + [20.0])  # one large prompt (skewness 4.1): the same rule
    r, w = 0.5 * x + 0.01 * np.sin(np.arange(20)), x + 0.01 * np.arange(20)
    iv = st.share_interval(r, w)
    assert not iv.declined and (iv.low, iv.high) == pytest.approx(_fieller(r, w, 1 - 1e-7))
    low95, high95 = _fieller(r, w, 0.95)
    assert iv.low < low95 < high95 < iv.high
    q = sps.norm.ppf((np.arange(40) + 0.5) / 40)  # symmetric effects: the same rule
    w, r = 5 + q, 0.4 * (5 + q) + 0.2 * q[::-1] * np.cos(np.arange(40))
    plain = st.share_interval(r, w)
    assert (plain.low, plain.high) == pytest.approx(_fieller(r, w, 1 - 1e-7))
    w = 0.3 + 0.5 * q  # the whole effect's t is 3.9 at 40 prompts: bounded at 95%, not at 99.99999%
    assert not math.isnan(_fieller(0.4 * w, w, 0.95)[0])
    declined = st.share_interval(0.4 * w + 0.01 * q[::-1], w)
    assert math.isnan(declined.low)
    assert declined.declined.startswith("the whole effect's interval at 99.99999% includes 0")


def test_an_interval_says_its_level_and_what_its_bounds_are():
    """A table prints the level the rule holds on docs/statistics.md's designs (95%), and the note
    names Fieller's level the bounds were computed at; a mean's level is its own."""
    q = sps.norm.ppf((np.arange(40) + 0.5) / 40)
    iv = st.share_interval(0.4 * (5 + q) + 0.2 * q[::-1] * np.cos(np.arange(40)), 5 + q)
    assert iv.level == pytest.approx(0.95) and iv.widened == "Fieller's bounds at 99.99999%"
    narrow = st.share_interval(5 + q, 5 + q + 0.1 * q[::-1], level=0.9)
    assert narrow.level == pytest.approx(0.9) and narrow.widened == "Fieller's bounds at 99.99998%"
    assert st.mean_interval(5 + q).level == pytest.approx(0.95)
    assert st.mean_interval(5 + q, level=0.8).level == pytest.approx(0.8)
    assert st.level_text(0.95) == "95%"
    assert st.level_text(None) == st.level_text(float("nan")) == "level not recorded"


def test_share_ci_is_the_ratio_of_sums_inside_its_interval():
    rng = np.random.default_rng(1)
    w = rng.normal(5, 1, 30)
    r = 0.4 * w + rng.normal(0, 0.2, 30)
    share, low, high = st.share_ci(r, w)
    assert share == pytest.approx(r.sum() / w.sum(), rel=1e-12) and low < share < high
    narrow = st.share_ci(r, w, level=0.5)
    assert low < narrow[1] < narrow[2] < high


@pytest.mark.parametrize("n", [8, 20, 40])
@pytest.mark.parametrize("family", FAMILIES)
def test_paired_p_keeps_its_error_rate_under_a_true_null(family, n):
    rate = null_rejection(family, n, 600, seed=n)
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 600), rate


def test_paired_p_is_not_exact_for_a_region_that_only_shares_its_nulls_mean():
    """Not a true null of the test: a region with its draws' mean, but skewed and twice as spread,
    is not exchangeable with them, and both the relabeling alone and paired_p reject it at 0.05
    far more often than 5% (docs/statistics.md has the table)."""
    sims = 400
    margin = 3 * math.sqrt(0.05 * 0.95 / sims)
    alone = skewed_region_rejection(20, sims, alternative="greater", region_sd=2.0, seed=20, relabeling_only=True)
    both = skewed_region_rejection(20, sims, alternative="greater", region_family="mirrored lognormal", region_sd=2.0,
                                   seed=20)
    assert alone > 0.05 + margin and both > 0.05 + margin, (alone, both)


def test_paired_p_finds_a_region_above_its_null_and_not_below_it():
    rng = np.random.default_rng(2)
    null = rng.normal(0, 1, (20, 10))
    region = null.mean(1) + 1.0 + rng.normal(0, 0.5, 20)
    assert st.paired_p(region, null) <= 1e-3
    assert st.paired_p(region, null, alternative="less") > 0.5
    assert st.paired_p(region, null) == pytest.approx(st.paired_p(region, null), abs=1e-15)  # seeded: the same p twice
    assert st.paired_p(region, null.mean(1)) <= 1e-3  # per-prompt null means: the sign flip alone


def test_least_p_is_the_floor_paired_p_reaches():
    n = 8
    region, null = np.arange(1.0, n + 1), np.zeros((n, 5))
    assert st.paired_p(region, null) == pytest.approx(st.least_p(n))
    assert st.least_p(8) == pytest.approx(1 / 256) and st.least_p(40) == pytest.approx(1 / 10000)


def test_holm():
    np.testing.assert_allclose(st.holm([0.01, 0.04, np.nan, 0.03]), [0.03, 0.06, np.nan, 0.06])
    np.testing.assert_allclose(st.holm([0.5, 0.01]), [0.5, 0.02])


@pytest.mark.parametrize("n", [6, 20, 40])
def test_rate_interval_keeps_its_coverage_at_every_rate(n):
    worst = min(rate_coverage(n, p) for p in np.linspace(0.01, 0.99, 99))
    assert worst >= 0.95 - 1e-9


def test_a_perfect_rate_is_never_a_point():
    rate, low, high = st.rate_ci(6, 6)
    assert rate == pytest.approx(1.0) and high == pytest.approx(1.0) and 0.5 < low < 0.6
    assert st.rate_cis([True] * 6) == pytest.approx(st.rate_ci(6, 6))
    assert all(math.isnan(v) for v in st.rate_ci(0, 0))
    with pytest.raises(ValueError):
        st.rate_ci(7, 6)


@pytest.mark.parametrize("n", [20, 40])
def test_paired_rate_difference_keeps_its_coverage(n):
    """Exact coverage (a sum over every table of n prompts) of the difference of two top-5
    rates on the same prompts, independent and nested hits, the rates of the component figures."""
    from weightgraft.stats.simulation import PAIRED_SETTINGS, paired_difference_coverage

    worst = min(paired_difference_coverage(n, a, b, both) for a, b, both in PAIRED_SETTINGS)
    assert worst >= 0.945


def test_a_paired_rate_difference_counts_only_what_differs():
    diff, low, high = st.paired_rate_difference_ci([1, 1, 0, 0] * 10, [1, 0, 0, 0] * 10)
    assert diff == pytest.approx(0.25) and 0 < low < 0.25 < high < 1
    same = st.paired_rate_difference_ci([1, 0] * 20, [1, 0] * 20)
    assert same[0] == pytest.approx(0.0) and same[1] < 0 < same[2]
    one_way = st.paired_rate_difference_ci([1] * 2 + [0] * 38, [0] * 40)  # 2 of 40 prompts differ
    assert one_way[0] == pytest.approx(0.05) and one_way[1] < 0  # 5 points from 2 prompts: not told from 0
    assert all(math.isnan(v) for v in st.paired_rate_difference_ci([], []))
    with pytest.raises(ValueError):
        st.paired_rate_difference_ci([1, 0], [1])


def test_model_label_p_over_models_not_pairs():
    seeds, nulls = ["a", "b", "c"], ["n1", "n2"]
    sim = {(x, y): (0.9 if x in seeds and y in seeds else 0.1) for i, x in enumerate(seeds + nulls)
           for y in (seeds + nulls)[i + 1:]}
    assert st.model_label_p(sim, seeds, nulls) == pytest.approx(1 / math.comb(5, 3))
    assert st.models_needed(2) == 5 and 1 / math.comb(5 + 2, 5) <= 0.05
    flat = {pair: 0.5 for pair in sim}
    assert st.model_label_p(flat, seeds, nulls) == pytest.approx(1.0)


@pytest.mark.parametrize("n", [8, 20, 40])
@pytest.mark.parametrize("family", FAMILIES)
def test_sign_test_keeps_its_error_rate_whatever_the_skew(family, n):
    """Differences with median 0 from every family (the skewed ones too): the exact binomial test
    rejects at most alpha of the time."""
    from weightgraft.stats.simulation import noise

    rng = np.random.default_rng(n)
    draws = noise(family, rng, (2000, n))
    centred = draws - np.median(noise(family, np.random.default_rng(99), 200_000))  # median 0
    rate = np.mean([st.sign_test_p(row) <= 0.05 for row in centred])
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000), rate


def test_sign_test_counts_prompts_not_magnitudes():
    assert st.sign_test_p(np.ones(10)) == pytest.approx(0.5 ** 10)
    assert st.sign_test_p(np.ones(10), alternative="less") == pytest.approx(1.0)
    assert st.sign_test_p(np.array([5.0, -0.1, -0.1, -0.1])) > 0.5  # one large value is one prompt
    assert math.isnan(st.sign_test_p(np.zeros(3)))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_threshold_p_agrees_with_the_share_interval(family: str) -> None:
    """``share_threshold_p <= 0.05`` exactly where ``share_interval``'s 95% interval (Fieller's
    bounds at 99.99999%) lies wholly past the threshold: a claims row's p and its printed interval
    cannot disagree. 400 seeded samples of 20-40 prompts per family, thresholds on both sides."""
    from weightgraft.stats import share_interval, share_threshold_p
    from weightgraft.stats.simulation import noise

    rng = np.random.default_rng(7)
    checked = 0
    for i in range(400):
        n = 20 + 20 * (i % 2)
        w = 4.0 + noise(family, rng, n)  # whole effects told from 0 at 99.99999%, so most intervals are given
        r = 0.3 * w + 0.3 * noise(family, rng, n)
        iv = share_interval(r, w)
        if np.isnan(iv.low):
            continue
        for t in (iv.low - 0.02, iv.low + 0.02, iv.high - 0.02, iv.high + 0.02, 0.3):
            assert (share_threshold_p(r, w, t, above=True) <= 0.05) == (iv.low > t), (i, t)
            assert (share_threshold_p(r, w, t, above=False) <= 0.05) == (iv.high < t), (i, t)
            checked += 1
    assert checked > 1000
