"""Reports on a run directory: markdown tables, figures like the paper's Figs. 2, 4 and 5,
and one self-contained HTML page with per-example top tokens (as in Appendix C.7).

Reads ``results.parquet`` (one row per model set, template, scheme and example),
``summary.csv`` (from :func:`weightgraft.evaluate.summarize`) and ``manifest.json``.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import typer

from weightgraft.evaluate import SUMMARY_KEYS, summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RESULTS_FILE = "results.parquet"
SUMMARY_FILE = "summary.csv"
MANIFEST_FILE = "manifest.json"
REQUIRED_COLUMNS: tuple[str, ...] = (
    "model_set", "template", "scheme", "family", "labels", "example_id", "prompt", "answer",
    "target_token", "rank", "prob", "top1", "top5", "top10", "top20", "top50", "top100",
    "answer_logprob", "top_tokens", "top_probs", "finite",
)
METRICS: dict[str, str] = {
    "top1": "top-1 accuracy (%)", "top5": "top-5 accuracy (%)", "top10": "top-10 accuracy (%)",
    "top20": "top-20 accuracy (%)", "top50": "top-50 accuracy (%)", "top100": "top-100 accuracy (%)",
    "mean_rank": "mean target rank (0 = top)", "median_rank": "median target rank (0 = top)",
}
# Families drawn with the baselines in the paper's Fig. 2 chart; every other family gets its own.
POSITION_FAMILIES = ("baseline", "position")
BAR_COLOURS = {"top5": "#3b6ea8", "top1": "#e08a3c"}
MAX_LISTED = 100  # exclusions and non-finite rows listed in the HTML page


class ReportError(ValueError):
    """A run directory that cannot be reported on."""


class MissingResultsError(ReportError):
    """The run directory holds no results.parquet."""


@dataclass(frozen=True)
class Run:
    """Everything a report reads from one run directory."""

    path: Path
    results: pd.DataFrame
    summary: pd.DataFrame
    manifest: dict[str, Any]
    labels: dict[tuple[str, str, str], dict[str, str]]  # (model_set, template, scheme) -> labels


@dataclass(frozen=True)
class ReportFigure:
    """One figure written as PNG and SVG."""

    title: str
    model_set: str
    template: str
    png: Path
    svg: Path


@dataclass(frozen=True)
class ReportPaths:
    """The files :func:`write_report` wrote."""

    out_dir: Path
    summary_md: Path
    html: Path
    figures: tuple[ReportFigure, ...]

    @property
    def png(self) -> list[Path]:
        """Every PNG figure."""
        return [f.png for f in self.figures]

    @property
    def svg(self) -> list[Path]:
        """Every SVG figure."""
        return [f.svg for f in self.figures]

    def all(self) -> list[Path]:
        """Every file written."""
        return [self.summary_md, self.html, *self.png, *self.svg]


# ---------------------------------------------------------------------------------------------
# Loading


def load_run(run_dir: Path) -> Run:
    """Read a run directory; the summary is recomputed if summary.csv is missing."""
    run_dir = Path(run_dir)
    results_path = run_dir / RESULTS_FILE
    if not results_path.is_file():
        raise MissingResultsError(
            f"{results_path} not found: there is no {RESULTS_FILE} in {run_dir}. It is written by "
            "the experiment runner (`weightgraft run CONFIG`); give `weightgraft report` the run "
            "directory that command wrote."
        )
    results = pd.read_parquet(results_path)
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        raise ReportError(f"{results_path} lacks the columns {', '.join(missing)}")
    if results.empty:
        raise ReportError(f"{results_path} holds no rows: nothing to report")
    for key in (*SUMMARY_KEYS, "family"):
        results[key] = results[key].astype(str)
    summary_path = run_dir / SUMMARY_FILE
    summary = read_summary(summary_path) if summary_path.is_file() else summarize(results)
    manifest_path = run_dir / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    return Run(run_dir, results, summary, manifest, scheme_labels(results))


def read_summary(path: Path) -> pd.DataFrame:
    """summary.csv with names kept as text (a scheme called "NA" stays "NA")."""
    text_cols = [*SUMMARY_KEYS, "family"]
    df = pd.read_csv(path, dtype={c: str for c in text_cols}, keep_default_na=False)
    for col in df.columns:
        if col not in text_cols:
            df[col] = pd.to_numeric(df[col].replace("", np.nan), errors="coerce")
    return df


def parse_labels(value: object) -> dict[str, str]:
    """A scheme's labels from its JSON text (or a dict); empty when absent."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return {}
    parsed = json.loads(str(value))
    if not isinstance(parsed, dict):
        raise ReportError(f"scheme labels must be a JSON object, got {value!r}")
    return {str(k): str(v) for k, v in parsed.items()}


def scheme_labels(results: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, str]]:
    """Labels of each (model_set, template, scheme), from its first row."""
    first = results.drop_duplicates(SUMMARY_KEYS)
    return {
        (str(r.model_set), str(r.template), str(r.scheme)): parse_labels(r.labels)
        for r in first.itertuples(index=False)
    }


def _groups(summary: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    """Summary rows by (model_set, template), in file order."""
    return [
        ((str(ms), str(tpl)), g.reset_index(drop=True))
        for (ms, tpl), g in summary.groupby(["model_set", "template"], sort=False)
    ]


# ---------------------------------------------------------------------------------------------
# Tables


def format_pct_ci(p: float, lo: float | None = None, hi: float | None = None) -> str:
    """A rate as percent with its interval: ``87.5 [75.0, 97.5]``; ``n/a`` when undefined."""
    if p is None or not math.isfinite(p):
        return "n/a"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{100 * p:.1f}"
    return f"{100 * p:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _fmt_rank(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.1f}"


def nonfinite_flag(n_nonfinite: int) -> str:
    """Text flagging rows left out of the averages for non-finite logits."""
    return f"⚠ {n_nonfinite} non-finite, excluded" if n_nonfinite else ""


TABLE_HEADER = ("scheme", "family", "n", "top-1 % [95% CI]", "top-5 % [95% CI]", "mean rank",
                "non-finite")


def table_rows(group: pd.DataFrame) -> list[tuple[str, ...]]:
    """Display cells of one (model_set, template) summary, in scheme order."""
    return [
        (
            str(r.scheme), str(r.family), str(int(r.n)),
            format_pct_ci(r.top1, r.top1_lo, r.top1_hi), format_pct_ci(r.top5, r.top5_lo, r.top5_hi),
            _fmt_rank(r.mean_rank), nonfinite_flag(int(r.n_nonfinite)),
        )
        for r in group.itertuples(index=False)
    ]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table (``|`` in cells escaped)."""
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _exclusions(manifest: dict[str, Any]) -> dict[str, Any]:
    ex = manifest.get("exclusions") or {}
    return {"total": int(ex.get("total", 0)), "by_reason": dict(ex.get("by_reason") or {}),
            "examples": list(ex.get("examples") or [])}


def summary_markdown(run: Run) -> str:
    """summary.md: a table per (model_set, template), non-finite flags, exclusions."""
    parts = [f"# weightgraft report: {run.path.name}", ""]
    for (ms, tpl), group in _groups(run.summary):
        parts += [f"## {ms} / {tpl}", "", markdown_table(TABLE_HEADER, table_rows(group)), ""]
        bad = group[group["n_nonfinite"] > 0]
        if len(bad):
            parts += [f"> ⚠ non-finite logits: {int(bad['n_nonfinite'].sum())} row(s) in "
                      f"{', '.join(bad['scheme'])}; left out of every average (n counts finite "
                      "rows only).", ""]
    ex = _exclusions(run.manifest)
    parts += ["## Exclusions", "", f"Examples excluded before the run: {ex['total']}", ""]
    if ex["by_reason"]:
        parts += [markdown_table(("reason", "count"),
                                 [(str(k), str(v)) for k, v in ex["by_reason"].items()]), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Figures (matplotlib's object API: no pyplot, no global backend switch, no GUI)


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
    note = f"whiskers: 95% bootstrap CI\nn = {_n_range(rows)} examples per scheme"
    if (rows["n_nonfinite"] > 0).any():
        note += "\n† non-finite rows left out"
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False,
              title=note, title_fontsize="x-small", alignment="left")
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
    label = METRICS[metric].replace(" (%)", "") + (" ± 95% CI" if err is not None else "")
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
    grid: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], metric: str,
    title: str, xlabel: str, ylabel: str,
) -> Figure:
    """An annotated heatmap of a rate (percent, 0-100) or a rank (log colour scale)."""
    from matplotlib.colors import LogNorm, Normalize

    is_rank = metric.endswith("rank")
    values = grid if is_rank else 100 * grid
    if is_rank:
        shown = values + 1  # rank 0 is the best: log scale on rank + 1
        vmax = float(np.nanmax(shown)) if np.isfinite(shown).any() else 2.0
        norm, cmap = LogNorm(vmin=1, vmax=max(vmax, 2.0)), "viridis_r"
    else:
        shown, norm, cmap = values, Normalize(0, 100), "viridis"
    n_rows, n_cols = grid.shape
    fig = _figure(min(30.0, max(6.0, 2.8 + 0.4 * n_cols)), max(2.8, 1.6 + 0.5 * n_rows))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, norm=norm, aspect="auto")
    ax.set_facecolor("0.9")
    if n_cols <= 40:
        _annotate(ax, values, shown, norm, is_rank)
    _tick_labels(ax, [display_name(c) for c in col_labels])
    ax.set_yticks(np.arange(n_rows), [display_name(r) for r in row_labels])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    scale = ", log colour scale" if is_rank else ""
    ax.set_title(f"{title}\n{METRICS[metric]}{scale}", fontsize="medium")
    fig.colorbar(im, ax=ax).set_label(METRICS[metric])
    return fig


def _annotate(ax: Axes, values: np.ndarray, shown: np.ndarray, norm: Any, is_rank: bool) -> None:
    """Write each cell's value, dark on the bright end of viridis, light on the dark end."""
    for (i, j), v in np.ndenumerate(values):
        if not math.isfinite(v):
            ax.text(j, i, "–", ha="center", va="center", fontsize="small", color="0.4")
            continue
        level = float(norm(shown[i, j]))
        bright = level < 0.4 if is_rank else level > 0.6
        text = f"{v:.1f}" if is_rank and v < 10 else f"{v:.0f}"
        ax.text(j, i, text, ha="center", va="center", fontsize="small",
                color="black" if bright else "white")


def _labelled(rows: pd.DataFrame, labels: dict[str, dict[str, str]], keys: Sequence[str]) -> pd.DataFrame:
    """Rows whose scheme carries every label in ``keys``, with those labels as columns."""
    keep = pd.Series([all(k in labels.get(s, {}) for k in keys) for s in rows["scheme"]],
                     index=rows.index, dtype=bool)
    out = rows[keep].copy()
    for k in keys:
        out[f"label_{k}"] = [labels[s][k] for s in out["scheme"]]
    return out


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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def save_figure(fig: Figure, stem: Path) -> tuple[Path, Path]:
    """Write ``stem``.png and ``stem``.svg (SVG text kept as text, no timestamp)."""
    import matplotlib

    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "weightgraft"}):
        fig.savefig(png, dpi=120, bbox_inches="tight")
        fig.savefig(svg, bbox_inches="tight", metadata={"Date": None})
    return png, svg


def _caption(fig: Figure) -> str:
    return fig.axes[0].get_title().replace("\n", "; ").replace(r"\$", "$")


def write_figures(run: Run, fig_dir: Path, heatmap_metrics: Sequence[str] = ("top5",)) -> list[ReportFigure]:
    """Draw and save every figure of the run under ``fig_dir``."""
    for metric in heatmap_metrics:
        if metric not in METRICS:
            raise ReportError(f"unknown heatmap metric {metric!r}; choose from {', '.join(METRICS)}")
    fig_dir.mkdir(parents=True, exist_ok=True)
    written: list[ReportFigure] = []
    used: set[str] = set()
    for (ms, tpl), group in _groups(run.summary):
        for name, fig in group_figures(run, ms, tpl, group, heatmap_metrics):
            stem = _slug(f"{ms}__{tpl}__{name}")
            while stem in used:  # two names may slug alike
                stem += "_"
            used.add(stem)
            png, svg = save_figure(fig, fig_dir / stem)
            written.append(ReportFigure(_caption(fig), ms, tpl, png, svg))
    return written


# ---------------------------------------------------------------------------------------------
# HTML


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2} .warn{color:#a40000;font-weight:bold}
code.tok{white-space:pre;background:#f6f6f6;padding:0 .2em}
mark.target{background:#ffd54f;outline:1px solid #c79a00}
figure{margin:1em 0} figure img{max-width:100%} figcaption{font-size:.85em;color:#555}
details{margin:.3em 0} summary{cursor:pointer} pre{background:#f6f6f6;padding:.5em;overflow:auto}
.p{color:#666;font-size:.85em}
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def html_table(header: Sequence[str], rows: Iterable[Sequence[str]], raw: bool = False,
               warn_col: int | None = None) -> str:
    """An HTML table; cells are escaped unless ``raw`` (cells already HTML)."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="warn"' if i == warn_col and cell else ""
            cells.append(f"<td{cls}>{cell if raw else _esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _token(text: object, target: str | None = None) -> str:
    shown = str(text).replace("\n", "\\n").replace("\t", "\\t")
    code = f'<code class="tok">{_esc(shown)}</code>'
    return f'<mark class="target">{code}</mark>' if str(text) == target else code


def _run_section(run: Run) -> str:
    m = run.manifest
    parts = ["<h2>Run</h2>", f"<p>directory: <code>{_esc(run.path)}</code>; started "
             f"{_esc(m.get('started', 'n/a'))}, finished {_esc(m.get('finished', 'n/a'))}</p>"]
    models = m.get("models") or {}
    if models:
        parts.append(html_table(("role", "source", "weights sha256"), [
            (role, info.get("source", ""), info.get("weights_sha256", ""))
            for role, info in models.items()]))
    versions = m.get("versions") or {}
    if versions:
        parts.append(html_table(("package", "version"), [(k, v) for k, v in versions.items()]))
    config = json.dumps(m.get("config", {}), indent=2, default=str)
    parts.append(f"<details><summary>config</summary><pre>{_esc(config)}</pre></details>")
    return "\n".join(parts)


def _summary_section(run: Run) -> str:
    parts = ["<h2>Summary</h2>", "<p>Rates in percent with 95% bootstrap intervals; n counts "
             "rows with finite logits; non-finite rows are flagged and left out of every average.</p>"]
    for (ms, tpl), group in _groups(run.summary):
        parts.append(f"<h3>{_esc(ms)} / {_esc(tpl)}</h3>")
        parts.append(html_table(TABLE_HEADER, table_rows(group), warn_col=len(TABLE_HEADER) - 1))
    return "\n".join(parts)


def _figures_section(figures: Sequence[ReportFigure]) -> str:
    parts = ["<h2>Figures</h2>"]
    for f in figures:
        data = base64.b64encode(f.png.read_bytes()).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(f.title)}">'
                     f"<figcaption>{_esc(f.title)} ({_esc(f.png.name)} / {_esc(f.svg.name)})"
                     "</figcaption></figure>")
    return "\n".join(parts)


def _exclusions_section(run: Run) -> str:
    ex = _exclusions(run.manifest)
    parts = ["<h2>Exclusions</h2>", f"<p>Examples excluded before the run: <b>{ex['total']}</b></p>"]
    if ex["by_reason"]:
        parts.append(html_table(("reason", "count"), list(ex["by_reason"].items())))
    if ex["examples"]:
        shown = ex["examples"][:MAX_LISTED]
        rows = [(e.get("template", ""), e.get("example_id", ""), e.get("reason", "")) for e in shown]
        parts.append(f"<details><summary>excluded examples ({len(shown)} of {len(ex['examples'])} "
                     f"listed)</summary>{html_table(('template', 'example', 'reason'), rows)}</details>")
    bad = run.results[~run.results["finite"].astype(bool)]
    parts.append(f"<p>Rows with non-finite logits (left out of every average): <b>{len(bad)}</b></p>")
    if len(bad):
        rows = [(r.model_set, r.template, r.scheme, r.example_id) for r in bad.head(MAX_LISTED).itertuples()]
        parts.append(html_table(("model set", "template", "scheme", "example"), rows))
    return "\n".join(parts)


def _example_rows(ex: pd.DataFrame, top_n: int) -> list[tuple[str, ...]]:
    """HTML cells per scheme: target rank and probability, then the top tokens."""
    rows = []
    for r in ex.itertuples(index=False):
        target = str(r.target_token)
        if not bool(r.finite):
            rows.append((_esc(r.scheme), '<span class="warn">non-finite logits</span>', "", *[""] * top_n))
            continue
        toks = list(r.top_tokens if r.top_tokens is not None else [])[:top_n]
        probs = list(r.top_probs if r.top_probs is not None else [])[:top_n]
        cells = [f'{_token(t, target)}<br><span class="p">{float(p):.3f}</span>'
                 for t, p in zip(toks, probs, strict=False)]
        rows.append((_esc(r.scheme), _esc(int(r.rank)), f"{float(r.prob):.3f}",
                     *cells, *[""] * (top_n - len(cells))))
    return rows


def _examples_section(run: Run, max_examples: int, top_n: int) -> str:
    order = {s: i for i, s in enumerate(dict.fromkeys(run.summary["scheme"]))}
    header = ("scheme", "target rank", "target p", *[f"#{i + 1}" for i in range(top_n)])
    parts = ["<h2>Examples: top tokens per scheme</h2>",
             '<p>The target token is <mark class="target">highlighted</mark>; probabilities '
             "under each token.</p>"]
    for (ms, tpl), sub in run.results.groupby(["model_set", "template"], sort=False):
        ids = list(dict.fromkeys(sub["example_id"]))
        shown = ids[:max_examples]
        parts.append(f"<h3>{_esc(ms)} / {_esc(tpl)}</h3><p>showing {len(shown)} of {len(ids)} examples</p>")
        sub = sub[sub["example_id"].isin(shown)]
        for eid, ex in sub.groupby("example_id", sort=False):
            ex = ex.sort_values("scheme", key=lambda s: s.map(order), kind="stable")
            first = ex.iloc[0]
            title = (f"{_esc(eid)}: {_esc(first['prompt'])} → {_esc(first['answer'])} "
                     f"(target {_token(first['target_token'])})")
            parts.append(f"<details><summary>{title}</summary>"
                         f"{html_table(header, _example_rows(ex, top_n), raw=True)}</details>")
    return "\n".join(parts)


def report_html(run: Run, figures: Sequence[ReportFigure], max_examples: int = 50, top_n: int = 10) -> str:
    """The self-contained report page (figures embedded as base64 PNG)."""
    body = "\n".join([
        f"<h1>weightgraft report: {_esc(run.path.name)}</h1>",
        _run_section(run), _summary_section(run), _figures_section(figures),
        _exclusions_section(run), _examples_section(run, max_examples, top_n),
    ])
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>weightgraft report: {_esc(run.path.name)}</title><style>{CSS}</style></head>"
            f"<body>\n{body}\n</body></html>\n")


# ---------------------------------------------------------------------------------------------
# Entry points


def write_report(
    run_dir: Path, out_dir: Path | None = None, *, max_examples: int = 50, top_n: int = 10,
    heatmap_metrics: Sequence[str] = ("top5",),
) -> ReportPaths:
    """Write summary.md, figures (PNG + SVG) and report.html for a run directory.

    ``out_dir`` defaults to ``run_dir/report``; ``max_examples`` caps the per-example tables per
    (model set, template); ``heatmap_metrics`` may add e.g. ``"mean_rank"`` to the grids.
    """
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    figures = write_figures(run, out / "figures", heatmap_metrics)
    md_path, html_path = out / "summary.md", out / "report.html"
    md_path.write_text(summary_markdown(run), encoding="utf-8")
    html_path.write_text(report_html(run, figures, max_examples, top_n), encoding="utf-8")
    return ReportPaths(out, md_path, html_path, tuple(figures))


def report_command(
    run_dir: Path = typer.Argument(..., help="Run directory written by `weightgraft run` (holds results.parquet)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder [default: RUN_DIR/report]."),
    max_examples: int = typer.Option(50, help="Per-example top-token tables per template in the HTML page."),
) -> None:
    """Write tables, figures and a self-contained HTML report for a run directory."""
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    try:
        paths = write_report(run_dir, out, max_examples=max_examples)
    except ReportError as err:
        raise typer.BadParameter(str(err), param_hint="RUN_DIR") from err
    console.print(Markdown(paths.summary_md.read_text(encoding="utf-8")))
    console.print(f"summary: {paths.summary_md}")
    console.print(f"report:  {paths.html}")
    console.print(f"figures: {len(paths.figures)} (PNG + SVG) in {paths.out_dir / 'figures'}")
