"""Reports from a synthetic run directory: files, figures, HTML page, markdown, errors."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from weightgraft.cli.report import report_command
from weightgraft.experiments.metrics import summarize
from weightgraft.experiments.prediction import TOP_K
from weightgraft.report import (
    MissingResultsError,
    ReportError,
    accuracy_bar_figure,
    component_figures,
    format_pct_ci,
    layer_position_figures,
    load_run,
    read_summary,
    write_report,
)

N_EXAMPLES = 6
SCRIPT_PROMPT = "<script>alert('x')</script> stars in a movie with"
# scheme -> (family, labels, how many of the 6 examples are top-5 hits, of which top-1)
SCHEMES: dict[str, tuple[str, dict[str, str], int, int]] = {
    "PRE": ("baseline", {"model": "pre"}, 0, 0),
    "SFT": ("baseline", {"model": "sft"}, 6, 5),
    "FE": ("position", {"positions": "FE"}, 2, 1),
    "LT": ("position", {"positions": "LT"}, 3, 1),
    "FE+LT": ("position", {"positions": "FE+LT"}, 6, 4),
    "(FE+LT)^C": ("position", {"positions": "(FE+LT)^C"}, 1, 0),
    "O+FFN@all": ("component", {"components": "O+FFN", "layers": "all", "positions": "last"}, 5, 2),
    "O+FFN@last_quarter": ("component", {"components": "O+FFN", "layers": "last_quarter", "positions": "last"}, 4, 2),
    "FFN@all": ("component", {"components": "FFN", "layers": "all", "positions": "last"}, 3, 0),
    "FFN@last_quarter": ("component", {"components": "FFN", "layers": "last_quarter", "positions": "last"}, 1, 0),
    "first_entity@L10": ("layer_window", {"positions": "first_entity", "layer_start": "10", "window": "1"}, 2, 0),
    "first_entity@L2": ("layer_window", {"positions": "first_entity", "layer_start": "2", "window": "1"}, 5, 1),
    "last@L2": ("layer_window", {"positions": "last", "layer_start": "2", "window": "1"}, 0, 0),
    "last@L10": ("layer_window", {"positions": "last", "layer_start": "10", "window": "1"}, 6, 3),
    "FE:none": ("hybrid", {"fe_components": "none"}, 2, 0),
    "FE:ATTN": ("hybrid", {"fe_components": "ATTN"}, 4, 1),
}
NONFINITE = ("LT", 0)  # (scheme, example index) with non-finite logits


def _row(template: str, scheme: str, i: int) -> dict:
    family, labels, n5, n1 = SCHEMES[scheme]
    target = f" Actor{i}"
    rank = 0 if i < n1 else 3 if i < n5 else 40
    finite = (scheme, i) != NONFINITE
    tokens = [f" Tok{j}" for j in range(20)]
    if finite and rank < 20:
        tokens[rank] = target
    probs = list(np.linspace(0.3, 0.01, 20))
    row = {
        "model_set": "sft2pre", "template": template, "scheme": scheme, "family": family,
        "labels": json.dumps(labels), "example_id": f"ex{i}", "relation_id": f"r{i}",
        "prompt": SCRIPT_PROMPT if i == 1 else f"Movie {i} stars Person{i} and",
        "answer": target.strip(), "target_token_id": 100 + i, "target_token": target,
        "rank": rank if finite else -1, "prob": probs[rank] if finite and rank < 20 else (0.001 if finite else float("nan")),
        "answer_logprob": -1.0 - rank if finite else float("nan"), "n_answer_tokens": 1,
        "top_tokens": tokens if finite else [], "top_probs": probs if finite else [], "finite": finite,
    }
    row.update({f"top{k}": finite and rank < k for k in TOP_K})
    return row


def make_results(templates: tuple[str, ...] = ("headline", "qa")) -> pd.DataFrame:
    return pd.DataFrame(
        [_row(t, s, i) for t in templates for s in SCHEMES for i in range(N_EXAMPLES)]
    )


def make_run(run_dir: Path, templates: tuple[str, ...] = ("headline", "qa")) -> pd.DataFrame:
    run_dir.mkdir(parents=True, exist_ok=True)
    results = make_results(templates)
    results.to_parquet(run_dir / "results.parquet")
    summary = summarize(results)
    summary.to_csv(run_dir / "summary.csv", index=False)
    manifest = {
        "config": {"name": "synthetic", "schemes": list(SCHEMES)},
        "versions": {"weightgraft": "0.1.0", "torch": "2.x"},
        "models": {"sft2pre": {"pre": {"spec": "models/pre", "source": "tiny-pre", "weights_sha256": "ab" * 32},
                               "sft": {"spec": "models/sft", "source": "tiny-sft", "weights_sha256": "cd" * 32}}},
        "exclusions": {"total": 7, "by_reason": {"multi_token_first_actor": 4, "duplicate": 3},
                       "examples": [{"template": "headline", "example_id": "gone1", "reason": "duplicate"}]},
        "started": "2025-01-01T00:00:00", "finished": "2025-01-01T00:10:00",
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return summary


SLOW_FIXTURES = ("written",)  # its tests are `slow` (tests/conftest.py): a report drawn, figures included


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    summary = make_run(run_dir)
    paths = write_report(run_dir, max_examples=4)
    return run_dir, summary, paths


def test_files_exist_under_the_default_folder(written):
    run_dir, _, paths = written
    assert paths.out_dir == run_dir / "report"
    for path in paths.all():
        assert path.is_file() and path.stat().st_size > 0, path
    assert paths.summary_md.name == "summary.md" and paths.html.name == "report.html"


def test_every_kind_of_figure_is_drawn_per_template(written):
    _, _, paths = written
    names = {p.stem for p in paths.png}
    for tpl in ("headline", "qa"):
        for kind in ("position", "position_mean_rank", "components_last_top5", "components_last_mean_rank",
                     "layer_position_w1_top5", "layer_position_w1_mean_rank", "hybrid"):
            assert f"sft2pre__{tpl}__{kind}" in names
        # the component and layer-window grids carry those families: no bar charts of them
        assert f"sft2pre__{tpl}__component" not in names and f"sft2pre__{tpl}__layer_window" not in names
    assert len(paths.png) == len(paths.svg) == 14


def test_pngs_are_images_and_svgs_are_xml(written):
    import matplotlib.image as mpimg

    _, _, paths = written
    for png in paths.png:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(png)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img.std() > 0  # not a blank canvas
    for svg in paths.svg:
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")


def test_markdown_has_ci_format_nonfinite_flag_and_exclusions(written):
    _, summary, paths = written
    md = paths.summary_md.read_text(encoding="utf-8")
    assert "## sft2pre / headline" in md and "## sft2pre / qa" in md
    sft = summary[(summary.template == "headline") & (summary.scheme == "SFT")].iloc[0]
    top5 = format_pct_ci(sft.top5, sft.top5_lo, sft.top5_hi)
    assert f"| {format_pct_ci(sft.top1, sft.top1_lo, sft.top1_hi)} | {top5} |" in md
    assert "[100.0, 100.0]" not in md  # a perfect rate on a few prompts is never a point
    lt_line = next(line for line in md.splitlines() if line.startswith("| LT |"))
    assert "| 5 |" in lt_line  # 6 examples, the non-finite one not counted
    assert "⚠ 1 non-finite, excluded" in lt_line
    # examples 0-2 are top-5 hits but 0 is non-finite: 2 of 5 finite rows, not 2 of 6 (33.3)
    assert "| 40.0 [" in lt_line and "33.3" not in lt_line
    fe_line = next(line for line in md.splitlines() if line.startswith("| FE |"))
    assert "non-finite" not in fe_line
    assert "Examples excluded before the run: 7" in md and "| duplicate | 3 |" in md


def test_html_is_self_contained_and_escapes_prompts(written):
    _, _, paths = written
    page = paths.html.read_text(encoding="utf-8")
    for scheme in SCHEMES:
        assert f"<td>{html.escape(scheme)}</td>" in page
    assert "(FE+LT)^C" in page and "O+FFN@last_quarter" in page
    assert page.count("data:image/png;base64,") == 14
    assert "<script" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert 'src="http' not in page and "<link" not in page
    assert '<mark class="target"><code class="tok"> Actor0</code></mark>' in page
    assert "<b>7</b>" in page and "multi_token_first_actor" in page
    assert "showing 4 of 6 examples" in page
    assert len(re.findall(r"<details><summary>ex\d: ", page)) == 2 * 4  # 4 examples for each of 2 templates
    assert "ex5:" not in page
    assert "ab" * 32 in page and "non-finite logits" in page
    # the provenance table: one row per (model set, role) with spec, source and hash (its first
    # digits shown, the whole of it the cell's tooltip)
    for role, source, digest in (("pre", "tiny-pre", "ab" * 32), ("sft", "tiny-sft", "cd" * 32)):
        assert (f"<td>sft2pre</td><td>{role}</td><td>models/{role}</td><td>{source}</td>"
                f'<td><code class="hash" title="{digest}">{digest[:12]}…</code>') in page
    assert "<td>default</td>" not in page


def test_missing_results_is_a_clear_value_error(tmp_path):
    with pytest.raises(MissingResultsError) as info:
        write_report(tmp_path)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert str(tmp_path / "results.parquet") in msg and "weightgraft run" in msg
    assert not (tmp_path / "report").exists()


def test_missing_columns_are_named(tmp_path):
    make_results(("qa",)).drop(columns=["top_tokens"]).to_parquet(tmp_path / "results.parquet")
    with pytest.raises(ReportError, match="top_tokens"):
        load_run(tmp_path)


def test_summary_is_recomputed_when_the_csv_is_missing(tmp_path):
    make_run(tmp_path, ("qa",))
    expected = pd.read_csv(tmp_path / "summary.csv")
    (tmp_path / "summary.csv").unlink()
    run = load_run(tmp_path)
    assert list(run.summary["scheme"]) == list(expected["scheme"])
    assert np.allclose(run.summary["top5"], expected["top5"])


def test_format_pct_ci():
    assert format_pct_ci(0.875, 0.75, 0.975) == "87.5 [75.0, 97.5]"
    assert format_pct_ci(float("nan"), float("nan"), float("nan")) == "n/a"
    assert format_pct_ci(0.5) == "50.0"


def test_read_summary_keeps_names_that_look_missing(tmp_path):
    df = pd.DataFrame({"model_set": ["NA"], "template": ["None"], "scheme": ["nan"], "family": ["custom"],
                       "n": [3], "top5": [float("nan")]})
    df.to_csv(tmp_path / "s.csv", index=False)
    back = read_summary(tmp_path / "s.csv")
    assert back.loc[0, ["model_set", "template", "scheme"]].tolist() == ["NA", "None", "nan"]
    assert np.isnan(back.loc[0, "top5"]) and back.loc[0, "n"] == 3


def test_read_summary_keeps_the_notes_that_flag_a_number(tmp_path):
    """An unstable recovery keeps its flag in the report's table (it was read as a number, NaN)."""
    note = "unstable: few examples (n=3)"
    df = pd.DataFrame({"model_set": ["m", "m"], "template": ["t", "t"], "scheme": ["FE", "LT"], "family": ["x", "x"],
                       "recovery": [0.5, 0.25], "recovery_lo": [0.1, 0.2], "recovery_hi": [0.9, 0.3],
                       "recovery_note": [note, ""], "recovery_answer": [0.4, 0.2], "recovery_answer_note": ["", note]})
    df.to_csv(tmp_path / "s.csv", index=False)
    back = read_summary(tmp_path / "s.csv")
    assert back["recovery_note"].tolist() == [note, ""] and back["recovery_answer_note"].tolist() == ["", note]
    assert back["recovery"].tolist() == pytest.approx([0.5, 0.25])


def _group_and_labels(tmp_path: Path):
    make_run(tmp_path, ("qa",))
    run = load_run(tmp_path)
    labels = {s: run.labels[("sft2pre", "qa", s)] for s in run.summary["scheme"]}
    return run.summary, labels


def test_component_grid_places_each_scheme_in_its_cell(tmp_path):
    group, labels = _group_and_labels(tmp_path)
    [(name, fig)] = component_figures(group, labels, "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["O+FFN", "FFN"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["all", "last_quarter"]
    grid = np.asarray(ax.images[0].get_array())
    assert np.allclose(grid, 100 * np.array([[5, 4], [3, 1]]) / 6)
    assert "PRE 0.0, SFT 100.0" in ax.get_title() and "top-5 accuracy" in ax.get_title()
    assert {t.get_text() for t in ax.texts} >= {"83", "67", "50", "17"}


def test_layer_heatmap_sorts_layers_numerically_and_offers_mean_rank(tmp_path):
    group, labels = _group_and_labels(tmp_path)
    [(_, fig)] = layer_position_figures(group, labels, "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "10"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["first_entity", "last"]
    assert np.allclose(np.asarray(ax.images[0].get_array()), 100 * np.array([[5, 2], [0, 6]]) / 6)
    [(name, fig)] = layer_position_figures(group, labels, "t", metric="mean_rank")
    assert name.endswith("mean_rank")
    ranks = group.set_index("scheme")["mean_rank"]
    expected = np.array([[ranks["first_entity@L2"], ranks["first_entity@L10"]],
                         [ranks["last@L2"], ranks["last@L10"]]])
    assert np.allclose(np.asarray(fig.axes[0].images[0].get_array()), expected + 1)  # log scale on rank+1


def test_bar_heights_and_nonfinite_marks(tmp_path):
    group, _ = _group_and_labels(tmp_path)
    rows = group[group["family"].isin(["baseline", "position"])]
    fig = accuracy_bar_figure(rows, "t")
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    n = len(rows)
    assert np.allclose(heights[:n], 100 * rows["top5"]) and np.allclose(heights[n:], 100 * rows["top1"])
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["PRE", "SFT", "FE", "LT †", "FE+LT", "(FE+LT)$^{C}$"]  # drawn as a superscript


def test_unknown_heatmap_metric_is_refused(tmp_path):
    make_run(tmp_path, ("qa",))
    with pytest.raises(ReportError, match="heatmap metric"):
        write_report(tmp_path, tmp_path / "out", heatmap_metrics=("top3",))


@pytest.mark.slow
def test_report_command(tmp_path):
    app = typer.Typer()
    app.command()(report_command)
    make_run(tmp_path / "run", ("qa",))
    runner = CliRunner()
    result = runner.invoke(app, [str(tmp_path / "run"), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert "FE+LT" in result.output and "report.html" in result.output
    assert (tmp_path / "rep" / "report.html").is_file()
    missing = runner.invoke(app, [str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "results.parquet" in missing.output


def test_empty_results_are_refused(tmp_path):
    make_results(("qa",)).head(0).to_parquet(tmp_path / "results.parquet")
    with pytest.raises(ReportError, match="no rows"):
        write_report(tmp_path)
