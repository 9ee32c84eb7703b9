"""The figures of each preset family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from weightgraft.report.charts import (
    _grid,
    _labelled,
    accuracy_bar_figure,
    heatmap_figure,
)
from weightgraft.report.run import POSITION_FAMILIES, Run
from weightgraft.report.tables import format_pct_ci

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _baseline_note(group: pd.DataFrame) -> str:
    base = group[group["family"] == "baseline"]
    return ", ".join(f"{s} {format_pct_ci(v)}" for s, v in zip(base["scheme"], base["top5"], strict=True))


def component_figures(group: pd.DataFrame, labels: dict[str, dict[str, str]], head: str,
                      metric: str = "top5") -> list[tuple[str, Figure]]:
    """Fig. 4: components (rows) x layer groups (columns), one grid per grafted position set."""
    rows = _labelled(group[group["family"] == "component"], labels, ("components", "layers"))
    if rows.empty:
        return []
    rows["label_positions"] = [labels[s].get("positions", "") for s in rows["scheme"]]
    base = _baseline_note(group)
    out = []
    for pos, sub in rows.groupby("label_positions", sort=False):
        comps = list(dict.fromkeys(sub["label_components"]))
        layers = list(dict.fromkeys(sub["label_layers"]))
        sub = sub.assign(row_key=sub["label_components"], col_key=sub["label_layers"])
        where = f" at {pos}" if pos else ""
        title = f"{head}: component grafting{where}\nbaselines (top-5 %): {base or 'none'}"
        out.append((f"components_{pos}_{metric}", heatmap_figure(
            _grid(sub, comps, layers, metric), comps, layers, metric, title, "layers", "components")))
    return out


def layer_position_figures(group: pd.DataFrame, labels: dict[str, dict[str, str]], head: str,
                           metric: str = "top5") -> list[tuple[str, Figure]]:
    """Layer x position heatmaps of layer_window schemes: x = first layer, y = position set."""
    rows = _labelled(group[group["family"] == "layer_window"], labels, ("positions", "layer_start"))
    if rows.empty:
        return []
    rows["label_window"] = [labels[s].get("window", "") for s in rows["scheme"]]
    out = []
    for window, sub in rows.groupby("label_window", sort=False):
        starts = sorted(dict.fromkeys(sub["label_layer_start"]), key=_natural_key)
        positions = list(dict.fromkeys(sub["label_positions"]))
        sub = sub.assign(row_key=sub["label_positions"], col_key=sub["label_layer_start"])
        size = f"window of {window} layer(s)" if window else "layer window"
        title = f"{head}: {size} grafted at each position set"
        out.append((f"layer_position_w{window}_{metric}", heatmap_figure(
            _grid(sub, positions, starts, metric), positions, starts, metric, title,
            "first grafted layer", "positions")))
    return out


def head_figures(group: pd.DataFrame, labels: dict[str, dict[str, str]], head: str,
                 metric: str = "top5") -> list[tuple[str, Figure]]:
    """Per-head sweeps over several layer sets: layer set (rows) x head (columns), one grid
    per grafted component and position set."""
    rows = _labelled(group[group["family"] == "head"], labels, ("components", "head", "layers"))
    if rows.empty or rows["label_layers"].nunique() < 2:
        return []
    rows["label_positions"] = [labels[s].get("positions", "") for s in rows["scheme"]]
    base = _baseline_note(group)
    out = []
    for (comp, pos), sub in rows.groupby(["label_components", "label_positions"], sort=False):
        layer_sets = list(dict.fromkeys(sub["label_layers"]))
        heads = sorted(dict.fromkeys(sub["label_head"]), key=_natural_key)
        sub = sub.assign(row_key=sub["label_layers"], col_key=sub["label_head"])
        title = f"{head}: head {comp} grafted at {pos}\nbaselines (top-5 %): {base or 'none'}"
        out.append((f"heads_{comp}_{pos}_{metric}", heatmap_figure(
            _grid(sub, layer_sets, heads, metric), layer_sets, heads, metric, title, "head", "layers")))
    return out


def _natural_key(text: str) -> tuple[int, float, str]:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def hybrid_figure(group: pd.DataFrame, labels: dict[str, dict[str, str]], head: str) -> list[tuple[str, Figure]]:
    """Fig. 5: a bar per first-entity component set of the hybrid schemes; baselines dashed."""
    rows = group[group["family"] == "hybrid"]
    if rows.empty:
        return []
    ticks = [labels.get(s, {}).get("fe_components", s) for s in rows["scheme"]]
    base = group[group["family"] == "baseline"]
    refs = {f"{s} top-5": float(v) for s, v in zip(base["scheme"], base["top5"], strict=True)}
    return [("hybrid", accuracy_bar_figure(
        rows, f"{head}: hybrid grafting", tick_labels=ticks, references=refs,
        xlabel="components grafted at the first entity (fe_components)"))]


def bar_figures(group: pd.DataFrame, head: str) -> list[tuple[str, Figure]]:
    """Fig. 2 (baselines + position schemes), then one chart per other family, baselines first."""
    out = []
    base = group[group["family"] == "baseline"]
    main = group[group["family"].isin(POSITION_FAMILIES)]
    if (main["family"] == "position").any() or set(group["family"]) == {"baseline"}:
        out.append(("position", accuracy_bar_figure(main, f"{head}: position grafting")))
    for family in dict.fromkeys(group["family"]):
        if family in (*POSITION_FAMILIES, "hybrid"):
            continue
        if family == "head" and (group["family"] == "head").sum() > 40:
            continue  # a layer x head grid shows these (head_figures)
        rows = pd.concat([base, group[group["family"] == family]])
        out.append((family, accuracy_bar_figure(rows, f"{head}: {family} schemes")))
    return out


def group_figures(run: Run, model_set: str, template: str, group: pd.DataFrame,
                  heatmap_metrics: Sequence[str] = ("top5",)) -> list[tuple[str, Figure]]:
    """Every figure of one (model_set, template): (name, figure) pairs."""
    labels = {s: run.labels.get((model_set, template, s), {}) for s in group["scheme"]}
    head = f"{model_set} · {template}".replace("$", r"\$")  # no mathtext in names
    out = bar_figures(group, head)
    for metric in heatmap_metrics:
        out += component_figures(group, labels, head, metric)
        out += layer_position_figures(group, labels, head, metric)
    for metric in dict.fromkeys([*heatmap_metrics, "mean_rank"]):  # single heads rarely reach top-5
        out += head_figures(group, labels, head, metric)
    return out + hybrid_figure(group, labels, head)
