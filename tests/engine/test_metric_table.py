"""The metric table: adding a metric is one ``MetricSpec``. A new entry reaches every row a
sweep scores, its summary, its paired differences and the report's table, with no other edit;
and the table reproduces the summary's columns in their order."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tiny_world import FIRST, SECOND, loader

from weightgraft.engine import metric_table
from weightgraft.engine.metric_table import METRIC_TABLE, MetricSpec, paired_metrics
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.metrics import summarize
from weightgraft.experiments.pairs import SchemePair, paired_differences
from weightgraft.experiments.runner import run_experiment
from weightgraft.report.tables import table_header, table_rows

TWICE = MetricSpec(name="twice_prob", meaning="2 p(answer): higher is better", higher_is_better=True, compute=lambda s: 2 * s.prediction.prob, aggregate="mean_ci", paired=True,
                   header="2 x probability", shown="mean_ci")


def _sweep(tmp_path, name: str):
    records = [{"prompt": f"{FIRST[i]} starred in a movie with", "answer": SECOND[i], "id": f"q{i}",
                "spans": {"subject": FIRST[i]}} for i in range(4)]
    data = tmp_path / "q.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    raw = {"name": name, "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
           "schemes": [{"preset": "position", "only": ["PRE", "SFT", "LT"]}], "out": str(tmp_path / name),
           "report": False}
    return run_experiment(parse_config(raw), load=loader, progress=False)


def test_a_new_entry_reaches_rows_summary_pairs_and_table(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metric_table, "METRIC_TABLE", (*METRIC_TABLE, TWICE))
    results = _sweep(tmp_path, "with").results
    np.testing.assert_allclose(results["twice_prob"], 2 * results["prob"], rtol=1e-12)
    summary = summarize(results)
    assert list(summary.columns[-4:]) == ["mean_twice_prob", "twice_prob_lo", "twice_prob_hi", "n_twice_prob"]
    by_scheme = results.groupby("scheme", sort=False)["twice_prob"].mean()
    np.testing.assert_allclose(summary.set_index("scheme")["mean_twice_prob"], by_scheme[summary["scheme"]], rtol=1e-12)
    pairs = paired_differences(results, [SchemePair(a="SFT", b="PRE")])
    row = pairs[pairs["metric"] == "twice_prob"].iloc[0]
    both = results.pivot(index="example_id", columns="scheme", values="twice_prob")
    assert row["mean_diff"] == pytest.approx(float((both["SFT"] - both["PRE"]).mean()), rel=1e-12)
    assert table_header()[-2] == "2 x probability"
    cells = table_rows(summary)
    first = summary.iloc[0]
    if np.isnan(first["twice_prob_lo"]):  # the t interval declined (too few or too skewed rows): the mean alone
        assert cells[0][-2] == f"{first['mean_twice_prob']:.2f}"
    else:
        assert cells[0][-2].startswith(f"{first['mean_twice_prob']:.2f} [")


def test_without_the_entry_nothing_of_it_appears(tmp_path) -> None:
    results = _sweep(tmp_path, "without").results
    assert "twice_prob" not in results and not any("twice_prob" in c for c in summarize(results).columns)
    assert "2 x probability" not in table_header() and "twice_prob" not in paired_metrics()


def test_the_table_lists_the_summary_columns_in_their_order() -> None:
    """The summary's columns after the keys and counts are the table's, entry by entry (an
    entry whose source columns are missing, as recovery's without baselines, writes none)."""
    rows = 12
    rng = np.random.default_rng(0)
    import pandas as pd

    results = pd.DataFrame({"model_set": "default", "template": "t", "scheme": ["A", "B"] * (rows // 2),
                            "family": "f", "finite": True, "example_id": np.repeat(np.arange(rows // 2), 2),
                            "rank": rng.integers(0, 50, rows), "prob": rng.random(rows),
                            "answer_logprob": -rng.random(rows), "logit_diff": rng.normal(size=rows),
                            "kl_donor": rng.random(rows), "fact_logprob": rng.normal(size=rows),
                            **{f"top{k}": rng.random(rows) < 0.5 for k in (1, 5, 10, 20, 50, 100)}})
    summary = summarize(results)
    expected = [c for m in METRIC_TABLE if m.aggregate != "ratio_of_means" for c in m.summary_columns()]
    assert list(summary.columns) == ["model_set", "template", "direction", "scheme", "family", "n", "n_nonfinite",
                                     "n_weak_first_token", *expected]
    assert "logit_diff_note" in expected and (summary["logit_diff_note"] == "").all()  # no flags column: none
    assert all(math.isfinite(v) for v in summary["mean_logit_diff"])
