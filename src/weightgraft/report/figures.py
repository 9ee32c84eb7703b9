"""Drawing and saving every figure of a run."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from weightgraft import atomic
from weightgraft.engine.metric_table import chart_labels, figure_defaults
from weightgraft.report.charts import trajectory_figure
from weightgraft.report.families import group_figures
from weightgraft.report.run import ReportError, ReportFigure, Run, _groups

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def save_figure(fig: Figure, stem: Path) -> tuple[Path, Path]:
    """Write ``stem``.png and ``stem``.svg (SVG text kept as text, no timestamp)."""
    import matplotlib

    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "weightgraft"}):
        write_figure(fig, png, dpi=120, bbox_inches="tight")
        write_figure(fig, svg, bbox_inches="tight", metadata={"Date": None})
    return png, svg


def write_figure(fig: Figure, path: Path, **options: object) -> None:
    """``fig.savefig`` to ``path`` atomically, in the format its suffix names."""
    path = Path(path)
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip("."), **options)


def _caption(fig: Figure) -> str:
    return fig.axes[0].get_title().replace("\n", "; ").replace(r"\$", "$")


def write_figures(run: Run, fig_dir: Path, heatmap_metrics: Sequence[str] | None = None,
                  k: int = 5) -> list[ReportFigure]:
    """Draw and save every figure of the run under ``fig_dir``; bar charts show top-``k``; the
    grids ``heatmap_metrics`` (default, and the choices: ``engine.metric_table``'s charts)."""
    heatmap_metrics = tuple(heatmap_metrics) if heatmap_metrics is not None else figure_defaults(k)[1]
    for metric in (*heatmap_metrics, *figure_defaults(k)[0]):
        if metric not in chart_labels():
            raise ReportError(f"unknown heatmap metric or k: {metric!r}; choose from {', '.join(chart_labels())}")
    fig_dir.mkdir(parents=True, exist_ok=True)
    written: list[ReportFigure] = []
    used: set[str] = set()
    for key, group in _groups(run.summary):
        ms, tpl, direction = key
        for name, fig in group_figures(run, key, group, k, heatmap_metrics):
            stem = _slug("__".join(p for p in (ms, tpl, direction, name) if p))
            while stem in used:  # two names may slug alike
                stem += "_"
            used.add(stem)
            png, svg = save_figure(fig, fig_dir / stem)
            written.append(ReportFigure(_caption(fig), ms, tpl, png, svg))
    return written + _trajectory_figures(run, fig_dir)


def _trajectory_figures(run: Run, fig_dir: Path) -> list[ReportFigure]:
    """A finetune's snapshots as model sets (``trajectory:``): per template and direction, each
    scheme's top-5 and fact log-probability against the step."""
    steps: dict[str, int] = run.manifest.model_set_steps
    rows = run.summary[run.summary["model_set"].isin(list(steps))]
    out = []
    for (tpl, direction), sub in rows.groupby(["template", "direction"], sort=False):
        sub = sub.assign(step=sub["model_set"].map(steps))
        title = f"{tpl} · {direction}: grafts of each snapshot of the finetune, by training step"
        png, svg = save_figure(trajectory_figure(sub, title), fig_dir / _slug(f"trajectory__{tpl}__{direction}"))
        out.append(ReportFigure(title, "trajectory", str(tpl), png, svg))
    return out
