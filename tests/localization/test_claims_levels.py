"""Each claims row says the level of its share's interval (``ci_level`` beside ``ci_low`` /
``ci_high``): 0.95, the level the rule holds on docs/statistics.md's designs, skewed or not (rules
8 wrote 0.99 where skew widened it, and such a row still prints 99%), and the localize report
prints each row's level beside its interval; a claims.csv written before the column renders as
"level not recorded", never as an assumed 95%."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from test_localize_claims import BY_NAME, N_LAYERS, _keys, _planted

from weightgraft.localization.claims.grafts import ClaimMap, judge_claims
from weightgraft.localization.claims.steps import first_held_text
from weightgraft.report.localize import _claims_section

N = 20


def _scaled_map(factor: np.ndarray, seed: int = 0) -> ClaimMap:
    """The planted map of test_localize_claims with each prompt's effects scaled by ``factor``: one
    large prompt makes the whole effect skewed for 20 prompts."""
    rng = np.random.default_rng(seed)
    keys = _keys()
    per = np.array([[f * _planted(k, rng) for k in keys] for f in factor])
    index = {k: i for i, k in enumerate(keys)}

    def effects(sets):
        return np.stack([[per[p, [index[k] for k in ks]].sum() for p, ks in enumerate(s)] for s in sets], axis=1)

    estimates = [{k: float(per[p, i]) for k, i in index.items()} for p in range(len(factor))]
    return ClaimMap([set(keys)] * len(factor), estimates, effects, {k[1]: 10 for k in keys}, N_LAYERS,
                    prompt_ids=[f"p{i}" for i in range(len(factor))])


SKEWED = np.array([1.0] * (N - 1) + [2.0])  # one large prompt: skewed effects, the same rule
EVEN = 1 + 0.2 * sps.norm.ppf((np.arange(N) + 0.5) / N)  # symmetric: skewness 0


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    """The fe_lt row of the skewed map and of the even one."""
    out = {}
    for name, factor in (("skewed", SKEWED), ("even", EVEN)):
        # seed 2: the even map's residuals have skewness 0.17, under the 0.45 that 20 prompts allow
        found, _ = judge_claims(_scaled_map(factor, seed=2), "m/t/s", claims=[BY_NAME["fe_lt"]], n_resamples=99)
        out[name] = {**found[0], "model": "m", "template": "t", "direction": "sufficiency"}
    return out


def test_a_claims_row_carries_the_level_its_interval_was_computed_at(rows):
    skewed, even = rows["skewed"], rows["even"]
    for row in (skewed, even):  # one rule for skewed and even effects: held at 95%, bounds at 99.99999%
        assert row["ci_level"] == pytest.approx(0.95) and row["ci_low"] < row["share_exact"] < row["ci_high"]


def _section(tmp_path, table: pd.DataFrame) -> str:
    table.to_csv(tmp_path / "claims.csv", index=False)
    return _claims_section(tmp_path)


def test_the_localize_report_prints_each_rows_own_level(rows, tmp_path):
    old = {**rows["skewed"], "ci_level": 0.99}  # a row of rules 8 widened for skew
    page = _section(tmp_path, pd.DataFrame([old, rows["even"]]))
    skewed, even = old, rows["even"]
    assert f"{skewed['share_exact']:.2f} [{skewed['ci_low']:.2f}, {skewed['ci_high']:.2f}] (99%)" in page
    assert f"{even['share_exact']:.2f} [{even['ci_low']:.2f}, {even['ci_high']:.2f}] (95%)" in page
    assert "[95% CI]" not in page


def test_an_old_claims_csv_without_the_level_renders_without_claiming_95(rows, tmp_path):
    old = pd.DataFrame([rows["skewed"], rows["even"]]).drop(columns=["ci_level"])
    page = _section(tmp_path, old)
    assert page.count("(level not recorded)") == 2 and "(95%)" not in page and "(99%)" not in page


def test_the_first_held_step_says_its_intervals_level():
    row = {"first_held": 70, "held_after": 60, "share_exact": 0.84, "ci_low": 0.77, "ci_high": 0.88, "ci_level": 0.99,
           "last_verdict": "holds"}
    assert first_held_text(row) == "step 70 (after step 60); share 0.84 [0.77, 0.88] (99%)"
    old = {k: v for k, v in row.items() if k != "ci_level"}  # a claims_steps.csv from before the column
    assert first_held_text(old).endswith("(level not recorded)")
