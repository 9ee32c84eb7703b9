"""The report as a reader sees it, from a real tiny run: every family has its figures, the
Run table lists each role, layer-window grids are on real layers, bar charts stay readable,
directions are summarized apart; and the CLI's help, version and console table."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import matplotlib.image as mpimg
import pandas as pd
import pytest
from rich.console import Console
from tiny_models import make_donor, make_tiny
from tiny_world import tokenizer, write_world
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli import app
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.metrics import summarize
from weightgraft.experiments.runner import run_experiment
from weightgraft.report import FAMILY_FIGURES, MAX_BARS, write_report
from weightgraft.report.console import print_summary
from weightgraft.report.families import FigureContext, family_bars, group_figures
from weightgraft.report.run import load_run
from weightgraft.schemes.families import PRESET_FAMILIES


def _every_preset() -> list[wg.Scheme]:
    p = wg.presets
    return (p.position(spans=True) + p.component() + p.hybrid() + p.unembed() + p.layer_dropout()
            + p.layer_window() + p.heads(n_heads=4, layers=["-2", "-1"]) + p.scale())


def test_every_family_a_preset_makes_has_its_figures():
    made = {s.family for s in _every_preset()}
    assert made == set(PRESET_FAMILIES)  # a renamed family shows up here ...
    assert set(PRESET_FAMILIES) <= set(FAMILY_FIGURES)  # ... and must have its figures


def _loader(spec: str, config=None) -> SimpleNamespace:
    """4-layer tiny Llamas (so layer windows of 2 layers differ from window numbers)."""
    tok = tokenizer()
    base = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=4)
    model = base if spec == "pre" else make_donor(base, seed=1)
    return SimpleNamespace(model=model, tokenizer=tok, source=f"tiny:{spec}", weights_sha256=f"sha-{spec}")


SLOW_FIXTURES = ("reported",)  # its tests are `slow` (tests/conftest.py): a tiny run and its report


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    root = tmp_path_factory.mktemp("house")
    data = write_world(root / "data")
    path = data / "test_prompts.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for i, r in enumerate(records):  # half the prompts ask the other way round
        r["direction"] = "a2b" if i % 2 == 0 else "b2a"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    config = parse_config({
        "name": "house", "data": str(data), "models": {"pre": "pre", "sft": "sft"},
        "out": str(root / "run"), "batch_size": 16, "templates": ["headline"],
        "schemes": [{"preset": "position"}, {"preset": "layer_window", "n_windows": 2},
                    {"preset": "component", "only": ["O+FFN@all", "O+FFN@first_half", "FFN@all", "FFN@first_half"]}],
    })
    result = run_experiment(config, load=_loader, progress=False)
    paths = write_report(root / "run", k=10)
    return result, paths


def test_summary_keeps_directions_apart(reported):
    result, paths = reported
    summary = result.summary
    assert set(summary["direction"]) == {"a2b", "b2a"}
    assert len(summary) == 2 * summary["scheme"].nunique()
    lt = result.results[result.results.scheme == "LT"]
    for direction, rows in lt.groupby("direction"):
        row = summary[(summary.scheme == "LT") & (summary.direction == direction)].iloc[0]
        assert row["n"] == len(rows) and row["top10"] == pytest.approx(rows["top10"].mean())
    md = paths.summary_md.read_text()
    assert "## default / headline / a2b" in md and "## default / headline / b2a" in md


def test_run_table_lists_every_role_with_spec_source_and_hash(reported):
    _, paths = reported
    page = paths.html.read_text()
    for role in ("pre", "sft"):
        assert f"<td>default</td><td>{role}</td><td>{role}</td><td>tiny:{role}</td><td>sha-{role}</td>" in page


def test_layer_window_grid_is_drawn_on_the_real_layers(reported):
    result, _ = reported
    run = load_run(result.run_dir)
    key = ("default", "headline", "a2b")
    group = run.summary[(run.summary.direction == "a2b")].reset_index(drop=True)
    figures = dict(group_figures(run, key, group, k=10, heatmap_metrics=("top10",)))
    ax = figures["layer_position_w1/2_top10"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0–1", "2–3"]  # 4 layers in 2 windows
    assert ax.get_xlabel() == "grafted layers (first–last)"
    assert "components_last_top10" in figures and "component" not in figures
    assert {"position", "position_mean_rank"} <= set(figures)
    bars = figures["position"].axes[0]
    assert "top-10 accuracy" in " ".join(t.get_text() for t in bars.get_legend().get_texts())


def test_pages_figures_are_images_of_readable_width(reported):
    _, paths = reported
    assert len(paths.png) >= 8
    for png in paths.png:
        assert mpimg.imread(png).shape[1] < 3000, png.name
    assert any("__a2b__" in p.name for p in paths.png) and any("__b2a__" in p.name for p in paths.png)
    page = paths.html.read_text()
    assert page.count("data:image/png;base64,") == len(paths.png)
    assert len(re.findall(r"<h3>default / headline / (a2b|b2a)</h3>", page)) == 2


def test_long_families_are_split_into_readable_bar_charts():
    schemes = [f"s{i}" for i in range(44)]
    rows = [{"model_set": "m", "template": "t", "direction": "", "scheme": s, "family": "component",
             "n": 5, "n_nonfinite": 0, "top1": 0.2, "top5": 0.4, "mean_rank": 3.0, "median_rank": 2.0}
            for s in ["PRE", "SFT", *schemes]]
    group = pd.DataFrame(rows)
    group.loc[:1, "family"] = "baseline"
    ctx = FigureContext(group, {}, "t")
    figures = family_bars(ctx, "component")
    accuracy = [f for name, f in figures if not name.endswith("mean_rank")]
    assert len(accuracy) == 2
    shown = [len(f.axes[0].get_xticklabels()) for f in accuracy]
    assert all(n <= MAX_BARS for n in shown)
    assert sum(n - 2 for n in shown) == 44  # every scheme once, baselines in each chart


def test_a_family_missing_from_the_table_still_gets_bars(tmp_path):
    rows = [{"model_set": "m", "template": "t", "scheme": "X", "family": "renamed_family", "labels": "{}",
             "example_id": "e", "relation_id": "r", "prompt": "p", "answer": "a", "target_token_id": 1,
             "target_token": "a", "rank": 0, "prob": 0.5, "answer_logprob": -1.0, "n_answer_tokens": 1,
             "top_tokens": ["a"], "top_probs": [0.5], "finite": True,
             **{f"top{k}": True for k in (1, 5, 10, 20, 50, 100)}}]
    pd.DataFrame(rows).to_parquet(tmp_path / "results.parquet")
    paths = write_report(tmp_path)
    assert any(p.stem.endswith("renamed_family") for p in paths.png)


def test_console_names_are_not_cut():
    names = ["O+FFN@last_quarter_with_a_long_suffix_1", "O+FFN@last_quarter_with_a_long_suffix_2", "o[3]@-1"]
    summary = summarize(pd.DataFrame([
        {"model_set": "m", "template": "t", "scheme": s, "family": "custom", "finite": True, "rank": 0,
         "prob": 1.0, "answer_logprob": 0.0, **{f"top{k}": True for k in (1, 5, 10, 20, 50, 100)}}
        for s in names]))
    console = Console(width=60, record=True)
    print_summary(summary, protocol="authors", console=console)
    text = console.export_text()
    # the protocol, then one model set: named in the title, not a column
    assert "(protocol authors, model set m)" in text
    cells: list[str] = []  # the scheme column, folded pieces joined back per row
    for line in text.splitlines():
        parts = line.split("│")
        if len(parts) < 5:
            continue
        if parts[3].strip():  # a new row starts where the n cell is filled
            cells.append("")
        cells[-1] += parts[2].strip()
    assert cells == names


def test_cli_version_and_defaults_in_help():
    runner = CliRunner()
    done = runner.invoke(app, ["--version"])
    assert done.exit_code == 0 and done.output.strip() == f"weightgraft {wg.__version__}"
    helptext = runner.invoke(app, ["report", "--help"], env={"COLUMNS": "200"}).output
    assert "[default: (RUN_DIR/report)]" in helptext and "[default: 50]" in helptext
    assert "[default: 5]" in helptext  # --k
    data = runner.invoke(app, ["data", "build", "--help"], env={"COLUMNS": "200"}).output
    assert "[default: (1000; all rows of --metadata)]" in data
