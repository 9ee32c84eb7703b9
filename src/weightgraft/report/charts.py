"""Chart primitives: accuracy bars and heatmaps with readable labels."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from weightgraft.engine.metric_table import chart_labels, chart_of
from weightgraft.report.run import BAR_COLOURS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure




def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _tick_labels(ax: Axes, labels: Sequence[str]) -> None:
    """x tick labels, rotated when long or many."""
    longest = max((len(s) for s in labels), default=0)
    rotate = longest > 6 or (len(labels) > 8 and longest > 3)
    ax.set_xticks(np.arange(len(labels)), labels, rotation=40 if rotate else 0,
                  ha="right" if rotate else "center", rotation_mode="anchor")


def accuracy_bar_figure(
    rows: pd.DataFrame, title: str, metrics: Sequence[str] = ("top5", "top1"),
    tick_labels: Sequence[str] | None = None, references: dict[str, float] | None = None,
    xlabel: str = "",
) -> Figure:
    """Grouped bars per scheme (Fig. 2): each metric in percent with its 95% CI.

    ``references`` draws dashed lines (e.g. baselines, as rates). Schemes with non-finite rows
    are marked with a dagger.
    """
    labels = list(tick_labels) if tick_labels is not None else [str(s) for s in rows["scheme"]]
    labels = [display_name(s) + (" †" if k else "") for s, k in zip(labels, rows["n_nonfinite"] > 0, strict=True)]
    n, width = len(rows), 0.8 / len(metrics)
    fig = _figure(min(30.0, max(5.5, 1.6 + 0.32 * n * len(metrics))), 4.6)
    ax = fig.add_subplot()
    x = np.arange(n)
    for i, metric in enumerate(metrics):
        _bars(ax, x + (i - (len(metrics) - 1) / 2) * width, rows, metric, width, annotate=i == 0)
    for j, (name, rate) in enumerate((references or {}).items()):
        if math.isfinite(rate):
            ax.axhline(100 * rate, ls="--", lw=1, color=f"C{j + 2}", label=f"{name}: {100 * rate:.1f}%")
    _tick_labels(ax, labels)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, 112)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("accuracy (%)")
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(title)
    note = f"whiskers: 95% Clopper-Pearson interval\nn = {_n_range(rows)} examples per scheme"
    if (rows["n_nonfinite"] > 0).any():
        note += "\n† non-finite rows left out"
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
              title=note, title_fontsize="x-small", alignment="left")
    return fig


def rank_bar_figure(rows: pd.DataFrame, title: str, tick_labels: Sequence[str] | None = None) -> Figure:
    """Mean rank of the target per scheme (0 = top), log scale on rank + 1; the median as a
    dot. Where accuracy bars sit at zero, ranks still tell schemes apart."""
    labels = list(tick_labels) if tick_labels is not None else [str(s) for s in rows["scheme"]]
    labels = [display_name(s) + (" †" if k else "") for s, k in zip(labels, rows["n_nonfinite"] > 0, strict=True)]
    n = len(rows)
    fig = _figure(min(30.0, max(5.5, 1.6 + 0.4 * n)), 4.6)
    ax = fig.add_subplot()
    x = np.arange(n)
    mean = rows["mean_rank"].to_numpy(dtype=float)
    ax.bar(x, np.nan_to_num(mean) + 1, 0.6, color="#6a8caf", label="mean rank")
    if "median_rank" in rows:
        ax.plot(x, rows["median_rank"].to_numpy(dtype=float) + 1, "o", color="0.15", ms=4, label="median rank")
    for xi, v in zip(x, mean, strict=True):
        ax.text(xi, (v + 1 if math.isfinite(v) else 1) * 1.08, "n/a" if not math.isfinite(v) else f"{v:.1f}",
                ha="center", va="bottom", fontsize="x-small")
    ax.set_yscale("log")
    ax.set_ylim(0.8, max(2.0, float(np.nanmax(mean + 1)) if np.isfinite(mean).any() else 2.0) * 2)
    _tick_labels(ax, labels)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel("target rank + 1 (log; 1 = top)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(f"{title}\nmean target rank (0 = top), lower is better", fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
              title=f"n = {_n_range(rows)} examples per scheme", title_fontsize="x-small")
    return fig


def display_name(name: str) -> str:
    """A scheme name for matplotlib: ``$`` kept literal, ``^C`` drawn as a superscript."""
    name = name.replace("$", r"\$")
    return re.sub(r"\^\{?([A-Za-z0-9]+)\}?", r"$^{\1}$", name)


def _n_range(rows: pd.DataFrame) -> str:
    lo, hi = int(rows["n"].min()), int(rows["n"].max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def _bars(ax: Axes, x: np.ndarray, rows: pd.DataFrame, metric: str, width: float, annotate: bool) -> None:
    """One metric's bars with CI whiskers; value labels above the first metric's bars."""
    vals = 100 * rows[metric].to_numpy(dtype=float)
    lo_col, hi_col = f"{metric}_lo", f"{metric}_hi"
    if lo_col in rows and hi_col in rows:
        lo, hi = 100 * rows[lo_col].to_numpy(dtype=float), 100 * rows[hi_col].to_numpy(dtype=float)
        err = np.nan_to_num(np.clip(np.vstack([vals - lo, hi - vals]), 0, None))
    else:
        hi, err = vals, None
    label = chart_labels()[metric].replace(" (%)", "") + (" ± 95% CI" if err is not None else "")
    ax.bar(x, np.nan_to_num(vals), width, yerr=err, capsize=3, label=label,
           color=BAR_COLOURS.get(metric), error_kw={"lw": 1, "ecolor": "0.2"})
    if annotate:
        for xi, v, top in zip(x, vals, hi, strict=True):
            text = "n/a" if not math.isfinite(v) else f"{v:.0f}"
            y = (top if math.isfinite(top) else 0) + 1.5
            ax.text(xi, y, text, ha="center", va="bottom", fontsize="x-small")


def _grid(rows: pd.DataFrame, row_keys: Sequence[str], col_keys: Sequence[str], metric: str) -> np.ndarray:
    """Values of ``metric`` arranged by (row key, column key); rows carry ``row_key``, ``col_key``."""
    grid = np.full((len(row_keys), len(col_keys)), np.nan)
    ri = {k: i for i, k in enumerate(row_keys)}
    ci = {k: i for i, k in enumerate(col_keys)}
    for r in rows.itertuples(index=False):
        grid[ri[r.row_key], ci[r.col_key]] = float(getattr(r, metric))
    return grid


def heatmap_figure(
    grid: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], *, metric: str,
    title: str, xlabel: str, ylabel: str,
) -> Figure:
    """An annotated heatmap of a summary column drawn as ``engine.metric_table`` says: a rate in
    percent (0-100), a rank (log colour scale on rank + 1) or a value (its own range); the
    colours run bright where the metric's better side is."""
    from matplotlib.colors import LogNorm, Normalize

    chart, spec = chart_of(metric)
    is_rank = chart.scale == "rank"
    values = 100 * grid if chart.scale == "pct" else grid
    finite = np.isfinite(values).any()
    if is_rank:
        shown = values + 1  # rank 0 is the best: log scale on rank + 1
        vmax = float(np.nanmax(shown)) if finite else 2.0
        norm = LogNorm(vmin=1, vmax=max(vmax, 2.0))
    elif chart.scale == "pct":
        shown, norm = values, Normalize(0, 100)
    else:
        shown, norm = values, Normalize(float(np.nanmin(values)) if finite else 0.0, float(np.nanmax(values)) if finite else 1.0)
    cmap = "viridis_r" if spec.higher_is_better is False else "viridis"
    n_rows, n_cols = grid.shape
    fig = _figure(min(30.0, max(6.0, 2.8 + 0.4 * n_cols)), max(2.8, 1.6 + 0.5 * n_rows))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, norm=norm, aspect="auto")
    ax.set_facecolor("0.9")
    if n_cols <= 40:
        _annotate(ax, values, shown, norm, cmap == "viridis_r", chart.scale)
    _tick_labels(ax, [display_name(c) for c in col_labels])
    ax.set_yticks(np.arange(n_rows), [display_name(r) for r in row_labels])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    scale = ", log colour scale" if is_rank else ""
    ax.set_title(f"{title}\n{chart.label}{scale}", fontsize="medium")
    fig.colorbar(im, ax=ax).set_label(chart.label)
    return fig


def _annotate(ax: Axes, values: np.ndarray, shown: np.ndarray, norm: Any, reverse: bool, scale: str) -> None:
    """Write each cell's value, dark on the bright end of viridis (its low end when
    ``reverse``), light on the dark end."""
    for (i, j), v in np.ndenumerate(values):
        if not math.isfinite(v):
            ax.text(j, i, "–", ha="center", va="center", fontsize="small", color="0.4")
            continue
        level = float(norm(shown[i, j]))
        bright = level < 0.4 if reverse else level > 0.6
        text = f"{v:.2f}" if scale == "value" else f"{v:.1f}" if scale == "rank" and v < 10 else f"{v:.0f}"
        ax.text(j, i, text, ha="center", va="center", fontsize="small",
                color="black" if bright else "white")


def _labelled(rows: pd.DataFrame, labels: Mapping[str, Mapping[str, str]], keys: Sequence[str]) -> pd.DataFrame:
    """Rows whose scheme carries every label in ``keys``, with those labels as columns."""
    keep = pd.Series([all(k in labels.get(s, {}) for k in keys) for s in rows["scheme"]],
                     index=rows.index, dtype=bool)
    out = rows[keep].copy()
    for k in keys:
        out[f"label_{k}"] = [labels[s][k] for s in out["scheme"]]
    return out


def scale_line_figure(rows: pd.DataFrame, baselines: pd.DataFrame, title: str) -> Figure:
    """Scaled grafts: per position set (``label_positions``), the mean answer probability and
    the mean fact-specific log-probability (with its 95% interval) against ``label_scale``; the
    baselines (PRE, SFT) dashed."""
    fig = _figure(11.0, 4.2)
    axes = fig.subplots(1, 2)
    panels = (("mean_prob", "p(answer's first token), mean", None),
              ("mean_fact_logprob", chart_labels()["mean_fact_logprob"] + ", mean ± 95% CI", "fact_logprob"))
    for ax, (column, label, ci) in zip(axes, panels, strict=True):
        for j, (pos, sub) in enumerate(rows.groupby("label_positions", sort=False)):
            sub = sub.assign(x=sub["label_scale"].astype(float)).sort_values("x")
            ax.plot(sub["x"], sub[column], marker="o", color=f"C{j}", label=display_name(str(pos)))
            if ci is not None and f"{ci}_lo" in sub:
                ax.fill_between(sub["x"], sub[f"{ci}_lo"], sub[f"{ci}_hi"], color=f"C{j}", alpha=0.15, lw=0)
        for k, (name, value) in enumerate(zip(baselines["scheme"], baselines.get(column, []), strict=False)):
            if math.isfinite(float(value)):
                ax.axhline(float(value), ls="--", lw=1, color=f"0.{3 + 3 * k}", label=f"{name} (whole model)")
        ax.axvline(1.0, ls=":", lw=1, color="0.5")
        ax.set_xlabel("scale (0: the base, 1: the graft)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
                   title=f"n = {_n_range(rows)} examples per point\nno band: interval declined (skewed for its n)",
                   title_fontsize="x-small")
    fig.suptitle(title)
    return fig


def trajectory_figure(rows: pd.DataFrame, title: str) -> Figure:
    """Grafts of a finetune's snapshots: per scheme, top-5 accuracy (%) and the mean
    fact-specific log-probability, each with its 95% interval, against the training step
    (``rows["step"]``)."""
    fig = _figure(11.0, 4.2)
    axes = fig.subplots(1, 2)
    panels = (("top5", 100.0, "top-5 accuracy (%) ± 95% CI"),
              ("mean_fact_logprob", 1.0, chart_labels()["mean_fact_logprob"] + ", mean ± 95% CI"))
    for ax, (column, unit, label) in zip(axes, panels, strict=True):
        ci = "fact_logprob" if column == "mean_fact_logprob" else column
        for j, (scheme, sub) in enumerate(rows.groupby("scheme", sort=False)):
            sub = sub.sort_values("step")
            ax.plot(sub["step"], unit * sub[column], marker="o", ms=3, color=f"C{j % 10}", label=display_name(str(scheme)))
            if f"{ci}_lo" in sub:
                ax.fill_between(sub["step"], unit * sub[f"{ci}_lo"], unit * sub[f"{ci}_hi"], color=f"C{j % 10}",
                                alpha=0.12, lw=0)
        ax.set_xlabel("training step of the snapshot")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
                   title=f"n = {_n_range(rows)} examples per point", title_fontsize="x-small")
    fig.suptitle(title)
    return fig
