"""Reports on a run directory: markdown tables, figures like the paper's, one HTML page.

Reads ``results.parquet`` (one row per model set, template, scheme and example),
``summary.csv`` and ``manifest.json``; writes ``summary.md``, figures (PNG + SVG) and a
self-contained ``report.html``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from weightgraft import atomic
from weightgraft.report.charts import (
    accuracy_bar_figure,
    heatmap_figure,
    rank_bar_figure,
)
from weightgraft.report.families import (
    FAMILY_FIGURES,
    MAX_BARS,
    component_figures,
    group_figures,
    head_figures,
    hybrid_figure,
    layer_position_figures,
)
from weightgraft.report.figures import write_figures
from weightgraft.report.html import report_html
from weightgraft.report.run import (
    MissingResultsError,
    ReportError,
    ReportFigure,
    ReportPaths,
    Run,
    load_run,
    read_summary,
)
from weightgraft.report.tables import format_pct_ci, summary_markdown

__all__ = [
    "FAMILY_FIGURES", "MAX_BARS", "MissingResultsError", "ReportError", "ReportFigure", "ReportPaths", "Run",
    "accuracy_bar_figure", "component_figures", "format_pct_ci", "group_figures",
    "head_figures", "heatmap_figure", "hybrid_figure", "layer_position_figures",
    "load_run", "rank_bar_figure", "read_summary", "report_html", "summary_markdown", "write_figures",
    "write_report",
]


def write_report(
    run_dir: Path, out_dir: Path | None = None, *, max_examples: int = 50, top_n: int = 10,
    heatmap_metrics: Sequence[str] | None = None, k: int = 5,
) -> ReportPaths:
    """Write summary.md, figures (PNG + SVG) and report.html for a run directory.

    ``out_dir`` defaults to ``run_dir/report``; ``max_examples`` caps the per-example tables per
    (model set, template); bar charts show top-``k`` and top-1 accuracy beside mean-rank bars;
    grids show ``heatmap_metrics`` (default: ``engine.metric_table.figure_defaults``, top-``k``
    and mean rank).
    """
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    figures = write_figures(run, out / "figures", heatmap_metrics, k)
    md_path, html_path = out / "summary.md", out / "report.html"
    atomic.write_text(md_path, summary_markdown(run))
    atomic.write_text(html_path, report_html(run, figures, max_examples, top_n))
    return ReportPaths(out, md_path, html_path, tuple(figures))
