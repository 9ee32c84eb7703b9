"""weightgraft.stats: each interval keeps its coverage (or declines as documented) and each test
its error rate, by seeded simulation at the sample sizes the defaults use (n = 8, 20, 40)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import weightgraft.stats as st
from weightgraft.stats.simulation import FAMILIES, null_rejection, rate_coverage, share_coverage

SIMS = 1000
MC = 3 * math.sqrt(0.05 * 0.95 / SIMS)  # three Monte Carlo standard errors at 95%


@pytest.mark.parametrize("n", [8, 20, 40])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mu", [1.0, 0.2])
def test_share_interval_covers_or_declines(family, n, mu):
    c = share_coverage(family, n, mu, SIMS, seed=n)
    assert c["covered_or_declined"] >= 0.95 - MC, c
    if family in ("normal", "t3") and c["given"] >= 200:  # where it gives one, it keeps its coverage
        assert c["coverage_given"] >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / c["given"]), c


def test_share_interval_declines_a_denominator_that_may_be_zero():
    rng = np.random.default_rng(0)
    w = rng.normal(0.0, 1.0, 40)
    iv = st.share_interval(0.3 * w + rng.normal(0, 0.1, 40), w)
    assert math.isnan(iv.low) and math.isnan(iv.high) and "includes 0" in iv.declined
    assert st.share_interval([1.0, 2.0], [1.0, 2.0]).declined == "fewer than 3 prompts"


def test_share_interval_declines_heavy_skew_and_says_how_many_prompts():
    x = np.array([10.0] * 19 + [60.0])
    iv = st.share_interval(0.5 * x, x + 0.01 * np.arange(20))
    assert iv.declined.startswith("effects too skewed for 20 prompts") and "n >= " in iv.declined


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
