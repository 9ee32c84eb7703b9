"""Issue 66's comparison (docs/statistics.md): the vectorized rules are the shipped interval sample
for sample, the new designs D5-D6 have the true ratios they state, and an undecided share's
"prompts needed" is seeded and says NaN where no number of such prompts decides it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import weightgraft.stats as st
from weightgraft.stats import share_rules as sr
from weightgraft.stats.share_designs import ShareDesign, criterion_designs


@pytest.mark.parametrize("n", [20, 80])
def test_the_vectorized_shipped_rule_is_share_interval_sample_for_sample(n: int) -> None:
    for j, d in enumerate(criterion_designs((n,))[::5]):
        b = sr.draw_batch(d, 60, 10 + j)
        low, high, level = sr.shipped_rule()(b)
        rng = np.random.default_rng(10 + j)
        for i in range(60):
            iv = st.share_interval(*d.draw(rng))
            assert (math.isnan(iv.low) and math.isnan(low[i])) or iv.low == pytest.approx(low[i], abs=1e-9), (d.label, i)
            assert (math.isnan(iv.high) and math.isnan(high[i])) or iv.high == pytest.approx(high[i], abs=1e-9)
            if not iv.declined:
                assert iv.level == pytest.approx(level[i])


@pytest.mark.parametrize("design", [ShareDesign("carriers", 80, 0.1, place="off"), ShareDesign("carriers", 80, 0.1, place="on"),
                                    ShareDesign("gamma", 80, 0.25, shape=1.0), ShareDesign("gamma", 80, 0.5, shape=0.5)],
                         ids=lambda d: d.label)
def test_the_new_designs_have_the_ratio_they_state(design: ShareDesign) -> None:
    rng = np.random.default_rng(3)
    r, w = zip(*(design.draw(rng) for _ in range(3000)))
    assert np.sum(r) / np.sum(w) == pytest.approx(design.truth, abs=0.01)


def test_d5_carriers_carry_most_of_the_whole_effect():
    d = ShareDesign("carriers", 80, 0.1)
    _, w = d.draw(np.random.default_rng(0))
    top = np.sort(w)[::-1]
    assert top[: len(w) // 4].sum() > 0.6 * w.sum()  # a quarter of the prompts, most of the effect


def test_tail_ratio_reads_a_long_tail_from_quantiles():
    q = np.linspace(-2, 2, 41)
    assert sr.tail_ratio(q) == pytest.approx(1.0)
    assert sr.tail_ratio(np.exp(1.5 * q)) > 4 and sr.tail_ratio(-np.exp(1.5 * q)) > 4


def test_prompts_needed_is_seeded_and_nan_where_the_share_is_not_past_the_threshold():
    rng = np.random.default_rng(1)
    w = 1 + 0.8 * rng.standard_normal(20)
    r = 0.4 * w + 0.3 * rng.standard_normal(20)
    need = st.prompts_needed(r, w, 0.2, above=True)
    assert 20 < need <= 640 and need == st.prompts_needed(r, w, 0.2, above=True)
    assert st.prompts_needed(r, w, 0.25, above=True) >= need  # nearer the threshold: more prompts
    assert math.isnan(st.prompts_needed(r, w, 0.5, above=True))  # the share is below 0.5: never `> 0.5`
    assert math.isnan(st.prompts_needed(r[:2], w[:2], 0.3, above=True))


def test_an_undecided_row_says_how_many_prompts_would_decide_it():
    from weightgraft.localization.claims.verdicts import _one

    row = pd.Series({"n_region_keys": 3, "null_kind": "random", "n_prompts": 20, "within_ci_low": 1.0,
                     "within_ci_high": 2.0, "within_effect": 1.5, "threshold": 0.3, "side": ">", "p_holm": 0.2,
                     "p_largest": "threshold", "ci_low": 0.2, "ci_high": 0.6, "null_p": 0.001, "prompts_needed": 120.0})
    verdict, why = _one(row)
    assert verdict == "undecided" and "about 120 prompts like these" in why
    assert "prompts like these" not in _one(row.drop("prompts_needed"))[1]


def test_the_vectorized_p_rates_are_share_threshold_p_sample_for_sample() -> None:
    d = ShareDesign("gamma", 40, 0.25, shape=0.5)
    b = sr.draw_batch(d, 200, 5)
    rates = sr.p_rates(b, alphas=(0.05,))
    rng = np.random.default_rng(5)
    ps = [(st.share_threshold_p(r, w, d.truth, above=True), st.share_threshold_p(r, w, d.truth, above=False))
          for r, w in (d.draw(rng) for _ in range(200))]
    assert rates["above_0.05"] == pytest.approx(np.mean([a <= 0.05 for a, _ in ps]))
    assert rates["below_0.05"] == pytest.approx(np.mean([b <= 0.05 for _, b in ps]))


@pytest.mark.slow
def test_the_widening_is_needed_where_the_ratio_rests_on_a_few_large_prompts() -> None:
    """The comparison's finding, on the suite's seeds (3000): where a true ratio rests on the few
    largest prompts (D6 shape 0.5, D4 sigma 1.5) Fieller's interval at 99.99% still misses above its
    bound at some n, and the rule before issue 66 (99% where skewed) too; the adopted widening keeps
    it (tests/stats/test_stats.py holds it on every design)."""
    designs = [ShareDesign("gamma", n, t, shape=0.5) for n in (20, 40, 80) for t in (0.25, 0.5)]
    designs += [ShareDesign("logistic", n, 0.5, sigma=1.5) for n in (40, 80)]
    batches = [sr.draw_batch(d, 2000, 3000 + j) for j, d in enumerate(designs)]
    for rule in (sr.fixed_level(0.9999), sr.moment_skew_rule()):
        assert not all(sr.passes(sr.rates(b, rule)) for b in batches)
    assert all(sr.passes(sr.rates(b, sr.shipped_rule())) for b in batches)
