"""One metric vocabulary: each quantity has one name, one sign and one implementation, in
``engine/metric_table.py``. A sweep's rows and localize compute KL and the logit difference
with the same function (localize's KL is ``neg_kl_donor``, minus the rows' ``kl_donor``); no
other module implements either; a metric registered there alone reaches the results, the
summary, the console, the report's table, the figures and localize."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from weightgraft.engine import metric_table
from weightgraft.engine.attribution import metric_values
from weightgraft.engine.metric_table import METRIC_TABLE, Chart, MetricSpec, ScoreInputs, score_next_token
from weightgraft.errors import GraftArgumentError
from weightgraft.experiments.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "src" / "weightgraft" / "engine" / "metric_table.py"


def _logits(seed: int = 0, rows: int = 3, vocab: int = 17) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _row(logits: torch.Tensor, answer: int, distractor: int | None, donor: torch.Tensor | None) -> dict:
    inputs = ScoreInputs(logits=logits[None], answer_ids=[answer], prediction=score_next_token(logits, answer),
                         distractor=distractor, donor_logits=donor)
    return metric_table.row_metrics(inputs)


def test_kl_is_one_quantity_with_one_sign_in_rows_and_localize():
    grafted, donor = _logits(0), _logits(1)
    targets = torch.tensor([2, 5, 9])
    reference = torch.log_softmax(donor, -1)
    localize = metric_values(grafted, targets, "neg_kl_donor", reference_logprobs=reference)
    rows = [_row(grafted[i], int(targets[i]), None, donor[i])["kl_donor"] for i in range(3)]
    # an independent statement of KL(donor || grafted), >= 0
    want = (reference.exp() * (reference - torch.log_softmax(grafted, -1))).sum(-1)
    np.testing.assert_allclose(rows, want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(localize.numpy(), -want.numpy(), rtol=1e-12)
    assert all(r > 0 for r in rows)
    assert metric_table.spec("kl_donor").higher_is_better is False
    assert metric_table.spec("neg_kl_donor").higher_is_better is True
    # the donor against itself: 0 both ways
    assert abs(float(metric_values(donor, targets, "neg_kl_donor", reference_logprobs=reference).abs().max())) < 1e-12


def test_logit_difference_and_first_logprob_agree_between_rows_and_localize():
    logits = _logits(2)
    targets, distractors = torch.tensor([1, 4, 6]), torch.tensor([3, 0, 12])
    localize = metric_values(logits, targets, "logit_diff", distractors)
    lp = metric_values(logits, targets, "first_logprob")
    for i in range(3):
        row = _row(logits[i], int(targets[i]), int(distractors[i]), None)
        assert row["logit_diff"] == pytest.approx(float(logits[i, targets[i]] - logits[i, distractors[i]]), rel=1e-12)
        assert row["logit_diff"] == pytest.approx(float(localize[i]), rel=1e-12)
        assert row["first_logprob"] == pytest.approx(float(lp[i]), rel=1e-12)
    assert np.isnan(_row(logits[0], 1, None, None)["logit_diff"]) and np.isnan(_row(logits[0], 1, None, None)["kl_donor"])


def test_kl_is_refused_and_logprob_read_as_first_logprob(tmp_path):
    from tiny_world import write_world

    from weightgraft.localization.config import parse_localize_config

    with pytest.raises(GraftArgumentError, match="neg_kl_donor"):
        metric_values(_logits(), torch.tensor([0, 1, 2]), "kl")
    with pytest.raises(GraftArgumentError, match="unknown metric"):  # lower is better: not an effect's sign
        metric_values(_logits(), torch.tensor([0, 1, 2]), "kl_donor")
    data = write_world(tmp_path / "data", n=2)
    raw = {"name": "loc", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}}
    assert parse_localize_config({**raw, "metric": "logprob"}).metric == "first_logprob"
    assert parse_localize_config(raw).metric == "first_logprob"
    with pytest.raises(ConfigError, match="neg_kl_donor"):
        parse_localize_config({**raw, "metric": "kl"})


def test_a_stored_localize_run_of_the_old_kl_is_refused_not_mixed(tmp_path):
    """A run directory written when localize's ``kl`` meant -KL is not extended under the new names."""
    from tiny_world import write_world

    from weightgraft.errors import WeightgraftError
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.run import _claim

    data = write_world(tmp_path / "data", n=2)
    raw = {"name": "loc", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}}
    config = parse_localize_config({**raw, "metric": "neg_kl_donor"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = {**config.model_dump(mode="json"), "metric": "kl"}
    (run_dir / "manifest.json").write_text(json.dumps({"identity": "0123456789abcdef", "config": old,
                                                       "examples": {}, "labels": 2}))
    with pytest.raises(WeightgraftError, match="another config"):
        _claim(run_dir, config, [])


# ---------------------------------------------------------------- no second implementation

SECOND_IMPLEMENTATION = re.compile(
    r"\bkl_div\b|\brel_entr\b|\bxlogy\b"  # library KLs
    r"|\.exp\(\)\s*\*\s*\("  # p.exp() * (p - q)
    r"|softmax\([^)]*\)\s*\*\s*\("  # softmax(x) * (log p - log q)
    r"|logits\[[^\]]+\]\s*-\s*logits\["  # logits[answer] - logits[distractor]
    r"|def\s+\w*(?:kl_divergence|kl_donor|logit_difference)\s*\("  # a function named for one
    r"|def\s+(?:kl|logit_diff)\s*\(")


def _second_implementations(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if SECOND_IMPLEMENTATION.search(line)]


def test_the_guard_finds_the_old_second_implementations():
    old_rows = ("def kl_divergence(donor_logits, logits):\n    return float((p.exp() * (p - q)).sum())\n"
                "def logit_difference(logits, answer, distractor):\n    return float(logits[answer] - logits[distractor])\n")
    old_localize = ("        return logits[rows, targets] - logits[rows, distractors.to(logits.device)]\n"
                    "        return -(ref.exp() * (ref - torch.log_softmax(logits, dim=-1))).sum(-1)\n"
                    "    return torch.nn.functional.kl_div(q, p, log_target=True)\n")
    assert len(_second_implementations(old_rows)) == 4 and len(_second_implementations(old_localize)) == 3
    assert _second_implementations("def logit_diff_note(flags):\n    out['logit_diff_flag'] = x\n") == []
    assert len(_second_implementations(REGISTRY.read_text(encoding="utf-8"))) >= 3  # the one home matches


def test_no_module_but_the_registry_implements_kl_or_the_logit_difference():
    found = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "src" / "weightgraft").rglob("*.py"))
             if p != REGISTRY and (hits := _second_implementations(p.read_text(encoding="utf-8")))}
    assert found == {}


# ---------------------------------------------------------------- a metric added in one place

TOY = MetricSpec(name="toy_margin", meaning="p(answer) - 0.5: higher is better", higher_is_better=True,
                 compute=lambda s: s.prediction.prob - 0.5, batch=lambda b: torch.softmax(b.logits, -1)[b.rows(), b.targets] - 0.5,
                 aggregate="mean_ci", header="toy margin", shown="mean_ci", console="toy margin",
                 chart=(Chart("mean_toy_margin", "toy margin (p - 0.5)", "value"),))


def test_a_metric_registered_once_reaches_results_summary_console_report_figures_and_localize(tmp_path, monkeypatch):
    from test_metric_table import _sweep

    from weightgraft.experiments.metrics import summarize
    from weightgraft.report import load_run
    from weightgraft.report.charts import heatmap_figure
    from weightgraft.report.console import print_summary
    from weightgraft.report.tables import summary_markdown

    monkeypatch.setattr(metric_table, "METRIC_TABLE", (*METRIC_TABLE, TOY))
    result = _sweep(tmp_path, "toy")
    results = result.results
    np.testing.assert_allclose(results["toy_margin"], results["prob"] - 0.5, rtol=1e-12)
    summary = summarize(results)
    assert {"mean_toy_margin", "toy_margin_lo", "toy_margin_hi", "n_toy_margin"} <= set(summary.columns)
    buf = io.StringIO()
    print_summary(summary, protocol="paper", console=Console(file=buf, width=250))
    text = buf.getvalue()
    assert "toy margin" in text and f"{summary['mean_toy_margin'].iloc[0]:.2f}" in text
    assert "| toy margin |" in summary_markdown(load_run(result.run_dir))
    grid = summary["mean_toy_margin"].to_numpy()[None]
    fig = heatmap_figure(grid, ["row"], list(summary["scheme"]), metric="mean_toy_margin", title="toy", xlabel="x", ylabel="y")
    assert "toy margin (p - 0.5)" in fig.axes[0].get_title()
    logits = _logits(4)
    got = metric_values(logits, torch.tensor([0, 1, 2]), "toy_margin")
    np.testing.assert_allclose(got.numpy(), torch.softmax(logits, -1)[[0, 1, 2], [0, 1, 2]].numpy() - 0.5)


def test_the_console_shows_the_registry_console_columns(monkeypatch):
    """Without an entry's ``console`` label its column leaves the console: nothing there is fixed."""
    import pandas as pd

    from weightgraft.report.console import print_summary

    summary = pd.DataFrame({"model_set": ["m"], "template": ["t"], "direction": [""], "scheme": ["S"], "n": [4],
                            "top1": [0.25], "top5": [0.5], "mean_rank": [3.0]})

    def shown(table: tuple[MetricSpec, ...]) -> str:
        monkeypatch.setattr(metric_table, "METRIC_TABLE", table)
        buf = io.StringIO()
        print_summary(summary, protocol="paper", console=Console(file=buf, width=200))
        return buf.getvalue()

    assert "top-5 %" in shown(METRIC_TABLE) and "50.0" in shown(METRIC_TABLE)
    quiet = tuple(MetricSpec(**{**m.__dict__, "console": None}) if m.name == "top5" else m for m in METRIC_TABLE)
    assert "top-5 %" not in shown(quiet) and "50.0" not in shown(quiet) and "25.0" in shown(quiet)
