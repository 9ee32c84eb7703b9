"""The report's figures, drawn as the paper draws them: one bar per scheme of a figure (top-5 with
its 95% interval as error bars; the mean rank for Figs. 8-9), the paper's stated values marked
on their bars and its stated drops named beside them, each legend entry naming the paper's model
whose level it is (another model's, unless the run's model is the paper's). Drawn from a sweep's summary rows (its
``stage.json``) with the project's bar charts (``weightgraft.report.charts``)."""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightgraft.paper.figures import DROP, RANK, TOP5, FigureRows
from weightgraft.paper.numbers import PAPER_NAMES, PaperNumber

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MARKERS = ("D", "o", "s", "^")  # one per paper model whose value is stated on a figure
CHART_FORMAT = "weightgraft-paper-chart/2"  # a change to how charts are drawn changes every digest


def figure_rows(fig: FigureRows, summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary rows a figure is drawn from (its test sentence and direction)."""
    return [r for r in summary if r["template"] == fig.template and r["direction"] == fig.direction]


def chart_digest(fig: FigureRows, summary: Sequence[dict[str, Any]], numbers: Sequence[PaperNumber],
                 model: str) -> str:
    """The sha256 of what a chart is drawn from: the same digest draws the same chart, so a
    report written again over a PNG of that digest need not draw it again."""
    stated = [(n.id, n.value, n.metric, n.scheme, n.model) for n in numbers if n.figure_id == fig.figure_id and n.stated]
    text = json.dumps([CHART_FORMAT, fig.figure_id, fig.label, fig.metric, figure_rows(fig, summary), stated, model],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def figure_chart(fig: FigureRows, summary: Sequence[dict[str, Any]], numbers: Sequence[PaperNumber],
                 model: str) -> Figure:
    """The figure's bar chart on ``model``'s sweep; the paper's stated top-5 values marked on
    their schemes' bars, a stated drop named in the legend (its unit is the paper's)."""
    import pandas as pd
    from matplotlib.lines import Line2D

    from weightgraft.report.charts import accuracy_bar_figure, rank_bar_figure

    rows = pd.DataFrame(figure_rows(fig, summary)).assign(n_nonfinite=0)
    rows["n"] = rows["n"].fillna(0)
    title = textwrap.fill(f"{fig.label}; {model}", 90)
    if fig.metric == RANK:
        return rank_bar_figure(rows, title)
    chart = accuracy_bar_figure(rows, title, metrics=("top5",))
    chart.set_size_inches(max(8.0, 4.0 + 0.6 * len(rows)), 5.0)  # room for long scheme names beside the legend
    ax = chart.axes[0]
    x = {str(s): i for i, s in enumerate(rows["scheme"])}
    stated = [n for n in numbers if n.figure_id == fig.figure_id and n.stated and n.number is not None]
    models = list(dict.fromkeys(n.model for n in stated if n.metric == TOP5 and n.scheme in x))
    for marker, paper_model in zip(MARKERS, models):
        marks = [(x[n.scheme], float(n.value)) for n in stated
                 if n.model == paper_model and n.metric == TOP5 and n.scheme in x]
        ax.plot([m[0] for m in marks], [m[1] for m in marks], linestyle="none", marker=marker, ms=7, color="black",
                markerfacecolor="white", label=textwrap.fill(_other_model(paper_model, model), 46), zorder=5)
    handles, labels = ax.get_legend_handles_labels()
    drops: dict[str, list[str]] = {}
    for n in stated:
        if n.metric == DROP:
            drops.setdefault(n.scheme, []).append(f"{n.paper_text()} ({n.model})")
    for scheme, said in drops.items():
        without, with_ = scheme.split(" vs ")
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(textwrap.fill(f"the paper: {with_} -> {without} drops top-5 by {', '.join(said)}; "
                                    f"points or relative, not said; its models', not {model}'s", 46))
    old = ax.get_legend()
    note = old.get_title().get_text() if old is not None else ""
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
              title=note, title_fontsize="x-small", alignment="left")
    return chart


def _other_model(paper_model: str, model: str) -> str:
    """A stated value's legend entry: whose level it is, and that it is not the bar's model's
    (the same model says so too: the bar is then ours on the paper's model)."""
    name = f"{PAPER_NAMES[paper_model]} ({paper_model})" if paper_model in PAPER_NAMES else paper_model
    if paper_model.lower() == model.rstrip("/").rsplit("/", 1)[-1].lower():
        return f"the paper's value on {name}, this model"
    return f"the paper's value on {name}: another model's level, drawn for its place only, not {model}'s"


def write_chart(chart: Figure, path: Path) -> Path:
    """The chart as a PNG at ``path`` (written atomically)."""
    from weightgraft.report.figures import write_figure

    write_figure(chart, path, dpi=110, bbox_inches="tight")
    return path
