"""The figures of a ``weightgraft experts`` report (matplotlib, Agg): per template and region, the
finetune's layer x expert map beside each control's, on one colour scale.

Colour is the mean effect of one expert grafted alone; the dot's area is the pick rate (the share
of the region's tokens where PRE's router picks the expert). Both go in one picture so that a
strong cell the router rarely picks reads differently from one it always picks; a cell with no dot
is never picked, and its effect is an exact 0, not a missing value (missing cells are grey).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from weightgraft.report.figures import write_figure

__all__ = ["expert_grid", "expert_heatmaps"]

NO_CELL = "#d9d9d9"  # a (layer, expert) the table lacks: grey, not white, which reads as 0
RATES = (0.25, 0.5, 1.0)  # pick rates drawn in the dot legend


def expert_grid(summary: pd.DataFrame, column: str, n_layers: int, n_experts: int) -> np.ndarray:
    """Layer x expert of ``column`` from ``experts.csv`` rows of one (model, template, region);
    NaN where the table has no row."""
    grid = np.full((n_layers, n_experts), np.nan)
    for layer, expert, value in zip(summary["layer"], summary["expert"], summary[column]):
        grid[int(layer), int(expert)] = float(value)
    return grid


def _scale(values: Sequence[np.ndarray]) -> float:
    """One symmetric colour limit for every panel: the largest |effect|, or 1 where all are 0."""
    finite = [np.nanmax(np.abs(v)) for v in values if np.isfinite(v).any()]
    vmax = max(finite, default=0.0)
    return float(vmax) if vmax > 0 else 1.0


def _ticks(n: int) -> list[int]:
    step = max(1, int(np.ceil(n / 16)))
    return list(range(0, n, step))


def expert_heatmaps(summary: pd.DataFrame, models: Sequence[str], title: str, path: Path, *,
                    metric: str) -> list[str]:
    """One panel per model (the finetune first, then its controls), layer (rows) x expert
    (columns), colour the mean effect on one symmetric scale, dot area the pick rate; returns the
    panels drawn (a model without rows here is left out)."""
    import matplotlib
    import matplotlib.pyplot as plt

    shown = [m for m in models if (summary["model"] == m).any()]
    n_layers = int(summary["layer"].max()) + 1
    n_experts = int(summary["expert"].max()) + 1
    effects = {m: expert_grid(summary[summary["model"] == m], "effect", n_layers, n_experts) for m in shown}
    rates = {m: expert_grid(summary[summary["model"] == m], "pick_rate", n_layers, n_experts) for m in shown}
    vmax = _scale(list(effects.values()))
    width = float(np.clip(0.22 * n_experts + 1.0, 2.6, max(2.6, 18.0 / len(shown))))  # the page scales it to fit
    height = float(np.clip(0.22 * n_layers + 1.4, 2.4, 10.0))
    fig, axes = plt.subplots(1, len(shown), figsize=(width * len(shown) + 1.2, height + 0.6), squeeze=False,
                             layout="constrained", sharey=True)
    # at pick rate 1 a dot spans half its cell's smaller side, so the colour around it still reads
    cell_pts = 72 * min(width / n_experts, height / n_layers)
    most = (0.5 * cell_pts) ** 2
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad=NO_CELL)
    im = None
    for ax, model in zip(axes.flat, shown):
        im = ax.imshow(effects[model], aspect="auto", origin="lower", cmap=cmap, vmin=-vmax, vmax=vmax,
                       interpolation="nearest")
        layer, expert = np.nonzero(np.nan_to_num(rates[model]) > 0)
        ax.scatter(expert, layer, s=most * rates[model][layer, expert], c="black", alpha=0.6, linewidths=0)
        ax.set_xticks(_ticks(n_experts))
        ax.set_yticks(_ticks(n_layers))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("expert", fontsize=8)
        ax.set_title(model, fontsize=9)
    axes.flat[0].set_ylabel("layer", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=list(axes.flat), shrink=0.85, label=f"mean effect ({metric})")
    handles = [plt.scatter([], [], s=most * r, c="black", alpha=0.6, linewidths=0) for r in RATES]
    fig.legend(handles, [f"{r:.2g}" for r in RATES], title="pick rate (dot area)", loc="outside lower center",
               ncol=len(RATES), fontsize=7, title_fontsize=7, frameon=False, handletextpad=1.5,
               columnspacing=2.5, borderaxespad=0.8)
    fig.suptitle(title, fontsize=9)
    write_figure(fig, path, dpi=110)
    plt.close(fig)
    return shown
