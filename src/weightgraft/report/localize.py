"""The report page of a ``weightgraft localize`` run: where the finetuned behaviour lives.

Position x layer heatmaps per component, a layer x component map at the last token, estimate
vs exact scatter plots with their agreement, and the recovery curve of the minimal graft search.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from weightgraft.experiments.localize.agreement import agreement, spearman


def _value_column(cells: pd.DataFrame) -> str:
    """The exact effect where every cell has one, else the gradient estimate."""
    return "exact" if cells["exact"].notna().all() else "estimate"


def _label_order(cells: pd.DataFrame) -> list[str]:
    """Position labels in prompt order (by their mean position)."""
    return list(cells.groupby("position_label")["position"].mean().sort_values().index)


def _heatmaps(cells: pd.DataFrame, column: str, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    layered = cells[cells["layer"].notna()]
    components = list(dict.fromkeys(layered["component"]))
    labels = _label_order(layered)
    n_layers = int(layered["layer"].max()) + 1
    cols = min(len(components), 5)
    rows = (len(components) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 0.25 * len(labels) * rows + 1.5), squeeze=False)
    mean = layered.groupby(["component", "position_label", "layer"])[column].mean()
    vmax = float(mean.abs().max()) or 1.0
    for ax, comp in zip(axes.flat, components):
        grid = mean.loc[comp].unstack("layer").reindex(index=labels, columns=range(n_layers))
        im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_title(comp, fontsize=9)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.set_xlabel("layer", fontsize=7)
    for ax in list(axes.flat)[len(components):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.6)
    fig.suptitle(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _last_token(cells: pd.DataFrame, column: str, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    last = cells[(cells["position_label"] == "last") & cells["layer"].notna()]
    grid = last.groupby(["layer", "component"])[column].mean().unstack("component")
    grid = grid[list(dict.fromkeys(last["component"]))]
    vmax = float(grid.abs().max().max()) or 1.0
    fig, ax = plt.subplots(figsize=(4 + 0.3 * grid.shape[1], 0.2 * grid.shape[0] + 1.5))
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=45, fontsize=7)
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=6)
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _scatter(cells: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    done = cells[cells["exact"].notna()]
    directions = list(dict.fromkeys(done["direction"]))
    fig, axes = plt.subplots(1, len(directions), figsize=(4.5 * len(directions), 4), squeeze=False)
    for ax, direction in zip(axes.flat, directions):
        sub = done[done["direction"] == direction]
        for col, colour in (("estimate", "tab:blue"), ("estimate_ig", "tab:orange")):
            if col in sub:
                rho = spearman(sub[col], sub["exact"])
                ax.scatter(sub["exact"], sub[col], s=3, alpha=0.4, color=colour, label=f"{col} (Spearman {rho:.2f})")
        ax.axline((0, 0), slope=1, color="grey", lw=0.8)
        ax.set_xlabel("exact effect")
        ax.set_ylabel("estimate")
        ax.set_title(direction)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _curves(search: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for entry in search.get("searches", []):
        xs = [p["size"] for p in entry["curve"]]
        ys = [p["share"] for p in entry["curve"]]
        ax.plot(xs, ys, marker=".", label=f"{entry['direction']} / {entry['template']} ({entry['size']} cells)")
        ax.axhline(entry["target_share"], color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("cells grafted (in attribution order)")
    ax.set_ylabel("share of the finetuned effect (exact)")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_localize_report(run_dir: Path) -> Path:
    """Draw every figure of a localize run and write ``report/index.html``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    cells = pd.read_parquet(run_dir / "cells.parquet")
    search_path = run_dir / "search.json"
    search = json.loads(search_path.read_text()) if search_path.is_file() else {}
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    parts = ["<h1>Where the finetuned behaviour lives</h1>"]
    for (direction, template), sub in cells.groupby(["direction", "template"], sort=False):
        column = _value_column(sub)
        stem = f"{direction}_{template}"
        _heatmaps(sub, column, f"{direction} / {template}: mean {column} per cell", out / f"heatmap_{stem}.png")
        _last_token(sub, column, f"{direction} / {template}: last token, mean {column}", out / f"last_{stem}.png")
        parts.append(f"<h2>{html.escape(direction)} / {html.escape(template)} ({column})</h2>"
                     f"<img src='heatmap_{stem}.png'><br><img src='last_{stem}.png'>")
    if cells["exact"].notna().any():
        n_layers = int(cells["layer"].max()) + 1
        table = agreement(cells, n_layers)
        table.to_csv(out / "agreement.csv", index=False)
        _scatter(cells, out / "scatter.png")
        parts.append("<h2>Estimates against exact effects</h2>" + table.to_html(index=False, float_format="%.3f")
                     + "<img src='scatter.png'>")
    if search.get("searches"):
        _curves(search, out / "recovery.png")
        rows = "".join(
            f"<tr><td>{html.escape(e['direction'])}</td><td>{html.escape(e['template'])}</td><td>{e['size']}</td>"
            f"<td>{e['share']:.3f}</td><td>{'yes' if e['reached'] else 'no'}</td></tr>" for e in search["searches"])
        parts.append("<h2>Minimal graft sets</h2><table><tr><th>direction</th><th>template</th><th>cells</th>"
                     f"<th>share</th><th>target met</th></tr>{rows}</table><img src='recovery.png'>")
    page = out / "index.html"
    page.write_text("<!doctype html><meta charset='utf-8'><title>localize</title>\n" + "\n".join(parts))
    return page
