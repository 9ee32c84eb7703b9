"""The figures of each graft family: a family's entry in ``weightgraft.schemes.families`` says
how it is drawn (a ``Figures`` kind), and ``FIGURE_MAKERS`` gives each kind its figures; a kind
missing here fails a test instead of silently losing its figures."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from weightgraft.engine.metric_table import figure_defaults
from weightgraft.report.charts import (
    _grid,
    _labelled,
    accuracy_bar_figure,
    heatmap_figure,
    rank_bar_figure,
    scale_line_figure,
)
from weightgraft.report.run import Run, group_title, layer_ranges
from weightgraft.report.tables import format_pct_ci
from weightgraft.schemes.families import FAMILIES, Figures, drawn_as
from weightgraft.schemes.scheme import BASELINE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_BARS = 24  # schemes per bar chart; longer families are split over several charts
Named = list[tuple[str, "Figure"]]


@dataclass(frozen=True)
class FigureContext:
    """What a family's figures read: one (model set, template, direction) of the summary."""

    group: pd.DataFrame
    labels: Mapping[str, Mapping[str, str]]
    head: str  # title prefix
    k: int = 5  # bar charts draw top-k (and top-1) accuracy
    heatmap_metrics: tuple[str, ...] = field(default_factory=lambda: figure_defaults(5)[1])
    layer_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def rows(self, family: str) -> pd.DataFrame:
        return self.group[self.group["family"] == family]

    @property
    def bar_metrics(self) -> tuple[str, ...]:
        return figure_defaults(self.k)[0]  # engine.metric_table says which


def _family_rows(group: pd.DataFrame, family: str | None, figures: Figures) -> pd.DataFrame:
    """The rows of ``family``, or of every family drawn with ``figures``."""
    return group[group["family"].isin((family,) if family is not None else drawn_as(figures))]


def _baseline_note(group: pd.DataFrame) -> str:
    """The baselines' default bar metric (a rate), for a grid's title."""
    base, column = group[group["family"] == BASELINE], figure_defaults(5)[0][0]
    return ", ".join(f"{s} {format_pct_ci(v)}" for s, v in zip(base["scheme"], base[column], strict=True))


def component_figures(group: pd.DataFrame, labels: Mapping[str, Mapping[str, str]], head: str,
                      metric: str = "top5", family: str | None = None) -> Named:
    """Fig. 4: components (rows) x layer groups (columns), one grid per grafted position set,
    of ``family`` (default: every family drawn as a component grid)."""
    rows = _labelled(_family_rows(group, family, Figures.COMPONENT_GRID), labels, ("components", "layers"))
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
            _grid(sub, comps, layers, metric), comps, layers, metric=metric, title=title, xlabel="layers", ylabel="components")))
    return out


def layer_position_figures(group: pd.DataFrame, labels: Mapping[str, Mapping[str, str]], head: str,
                           metric: str = "top5",
                           layer_ranges: Mapping[str, tuple[int, int]] | None = None,
                           family: str | None = None) -> Named:
    """Layer x position heatmaps of layer-window schemes (``family``; default: every family
    drawn so): x = the layers grafted, y = position set. ``layer_ranges`` (scheme -> first,
    last layer, resolved at the model's depth) gives the real layers; without it the columns
    are the schemes' ``layer_start`` labels."""
    rows = _labelled(_family_rows(group, family, Figures.LAYER_POSITION_GRID), labels, ("positions", "layer_start"))
    if rows.empty:
        return []
    rows["label_window"] = [labels[s].get("window", "") for s in rows["scheme"]]
    ranges = layer_ranges or {}
    resolved = bool(ranges) and all(s in ranges for s in rows["scheme"])
    if resolved:
        rows["label_layer_start"] = [_range_text(ranges[s]) for s in rows["scheme"]]
    out = []
    for window, sub in rows.groupby("label_window", sort=False):
        if resolved:
            starts = sorted(dict.fromkeys(sub["label_layer_start"]), key=lambda t: int(t.split("–")[0]))
            xlabel = "grafted layers (first–last)"
        else:
            starts = sorted(dict.fromkeys(sub["label_layer_start"]), key=_natural_key)
            xlabel = "layer_start label (the model depth is not recorded in this run)"
        positions = list(dict.fromkeys(sub["label_positions"]))
        sub = sub.assign(row_key=sub["label_positions"], col_key=sub["label_layer_start"])
        size = f"window of {window} of the layers" if window else "layer window"
        title = f"{head}: {size} grafted at each position set"
        out.append((f"layer_position_w{window}_{metric}", heatmap_figure(
            _grid(sub, positions, starts, metric), positions, starts, metric=metric, title=title,
            xlabel=xlabel, ylabel="positions")))
    return out


def _range_text(span: tuple[int, int]) -> str:
    lo, hi = span
    return str(lo) if lo == hi else f"{lo}–{hi}"


def head_figures(group: pd.DataFrame, labels: Mapping[str, Mapping[str, str]], head: str,
                 metric: str = "top5", family: str | None = None) -> Named:
    """Per-head sweeps over several layer sets: layer set (rows) x head (columns), one grid
    per grafted component and position set, of ``family`` (default: every family drawn so)."""
    rows = _labelled(_family_rows(group, family, Figures.HEAD_GRID), labels, ("components", "head", "layers"))
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
            _grid(sub, layer_sets, heads, metric), layer_sets, heads, metric=metric, title=title, xlabel="head", ylabel="layers")))
    return out


def _natural_key(text: str) -> tuple[int, float, str]:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def hybrid_figure(group: pd.DataFrame, labels: Mapping[str, Mapping[str, str]], head: str,
                  metric: str = "top5", family: str | None = None) -> Named:
    """Fig. 5: a bar per first-entity component set of the hybrid schemes (``family``; default:
    every family drawn so); baselines dashed."""
    rows = _family_rows(group, family, Figures.HYBRID_BARS)
    if rows.empty:
        return []
    ticks = [labels.get(s, {}).get("fe_components", s) for s in rows["scheme"]]
    base = group[group["family"] == BASELINE]
    refs = {f"{s} {metric}": float(v) for s, v in zip(base["scheme"], base[metric], strict=True)}
    metrics = (metric, "top1") if metric != "top1" else ("top1",)
    name = family or "hybrid"
    return [(name, accuracy_bar_figure(
        rows, f"{head}: {name} grafting", metrics=metrics, tick_labels=ticks, references=refs,
        xlabel="components grafted at the first entity (fe_components)"))]


def _bar_pair(ctx: FigureContext, rows: pd.DataFrame, name: str, title: str) -> Named:
    """Accuracy bars (top-k, top-1) and mean-rank bars of the same schemes, split into charts
    of at most ``MAX_BARS`` schemes (baselines repeated in each)."""
    base = ctx.rows(BASELINE)
    rest = rows[rows["family"] != BASELINE]
    room = max(1, MAX_BARS - len(base))
    chunks = [rest.iloc[i : i + room] for i in range(0, len(rest), room)] or [rest]
    out: Named = []
    for j, chunk in enumerate(chunks):
        part = pd.concat([base, chunk]) if not (rows["family"] == BASELINE).all() else rows
        suffix = f" ({j + 1} of {len(chunks)})" if len(chunks) > 1 else ""
        stem = name if j == 0 else f"{name}_{j + 1}"
        out.append((stem, accuracy_bar_figure(part, f"{title}{suffix}", metrics=ctx.bar_metrics)))
        out.append((f"{stem}_mean_rank", rank_bar_figure(part, f"{title}{suffix}")))
    return out


def baseline_bars(ctx: FigureContext, family: str) -> Named:
    """The baselines alone, when no position family draws them (it includes them)."""
    if any(not ctx.rows(f).empty for f in drawn_as(Figures.POSITION_BARS)):
        return []
    return _bar_pair(ctx, ctx.rows(BASELINE), "position", f"{ctx.head}: baselines")


def position_bars(ctx: FigureContext, family: str) -> Named:
    """Fig. 2: baselines and position schemes."""
    return _bar_pair(ctx, ctx.rows(family), family, f"{ctx.head}: {family} grafting")


def family_bars(ctx: FigureContext, family: str) -> Named:
    """Baselines and the family's schemes (any family without a figure of its own)."""
    return _bar_pair(ctx, ctx.rows(family), family, f"{ctx.head}: {family} schemes")


def component_grids(ctx: FigureContext, family: str) -> Named:
    """Fig. 4 grids (components x layer groups) for each heatmap metric; schemes the grid
    cannot place (no component/layer labels) get bars."""
    out: Named = []
    for metric in ctx.heatmap_metrics:
        out += component_figures(ctx.group, ctx.labels, ctx.head, metric, family)
    return out or family_bars(ctx, family)


def layer_window_grids(ctx: FigureContext, family: str) -> Named:
    """Layer x position grids for each heatmap metric."""
    out: Named = []
    for metric in ctx.heatmap_metrics:
        out += layer_position_figures(ctx.group, ctx.labels, ctx.head, metric, ctx.layer_ranges, family)
    return out or family_bars(ctx, family)


def head_grids(ctx: FigureContext, family: str) -> Named:
    """Layer x head grids when the sweep covers several layer sets, else bars."""
    out: Named = []
    for metric in ctx.heatmap_metrics:
        out += head_figures(ctx.group, ctx.labels, ctx.head, metric, family)
    return out or family_bars(ctx, family)


def hybrid_bars(ctx: FigureContext, family: str) -> Named:
    return hybrid_figure(ctx.group, ctx.labels, ctx.head, ctx.bar_metrics[0], family)


def scale_lines(ctx: FigureContext, family: str) -> Named:
    """Scaled grafts: each position set's answer probability and fact log-probability against
    the scale; schemes without position and scale labels get bars."""
    rows = _labelled(ctx.rows(family), ctx.labels, ("positions", "scale"))
    if rows.empty:
        return family_bars(ctx, family)
    return [(f"{family}_lines", scale_line_figure(rows, ctx.rows(BASELINE), f"{ctx.head}: scaled position grafts, weights base + scale × (donor − base)"))]


FigureMaker = Callable[[FigureContext, str], Named]
# how each kind of family is drawn (its entry in weightgraft.schemes.families names the kind)
FIGURE_MAKERS: dict[Figures, tuple[FigureMaker, ...]] = {
    Figures.BASELINES: (baseline_bars,),
    Figures.POSITION_BARS: (position_bars,),
    Figures.BARS: (family_bars,),
    Figures.COMPONENT_GRID: (component_grids,),
    Figures.LAYER_POSITION_GRID: (layer_window_grids,),
    Figures.HEAD_GRID: (head_grids,),
    Figures.HYBRID_BARS: (hybrid_bars,),
    Figures.SCALE_LINES: (scale_lines,),
}


class _FamilyFigures(Mapping[str, tuple[FigureMaker, ...]]):
    """family -> the figures that draw it, read from the registry when asked; a family not
    registered (a user's own name) gets ``family_bars``."""

    def __getitem__(self, family: str) -> tuple[FigureMaker, ...]:
        return FIGURE_MAKERS[FAMILIES[family].figures]

    def __iter__(self) -> Iterator[str]:
        return iter(list(FAMILIES))

    def __len__(self) -> int:
        return len(FAMILIES)


FAMILY_FIGURES: Mapping[str, tuple[FigureMaker, ...]] = _FamilyFigures()


def group_figures(run: Run, key: tuple[str, str, str], group: pd.DataFrame, k: int = 5,
                  heatmap_metrics: Sequence[str] | None = None) -> Named:
    """Every figure of one (model set, template, direction): (name, figure) pairs, family by
    family in the order the summary lists them."""

    model_set, template, _ = key
    labels = {s: run.labels.get((model_set, template, s), {}) for s in group["scheme"]}
    head = group_title(key, " · ").replace("$", r"\$")  # no mathtext in names
    grids = tuple(heatmap_metrics) if heatmap_metrics is not None else figure_defaults(k)[1]
    ctx = FigureContext(group, labels, head, k, grids, layer_ranges(run.manifest, model_set))
    out: Named = []
    for family in dict.fromkeys(group["family"]):
        for make in FAMILY_FIGURES.get(family, (family_bars,)):
            out += make(ctx, family)
    return out
