"""The figures of a ``weightgraft localize`` report (matplotlib, Agg): cell heatmaps with the
global slots beside the layers, the last token's layer x component map, estimate vs exact, and
the recovery curves of the found sets.

Heatmaps share one colour scale per figure, global slots included (``unembed`` at the last
token is often the largest cell); position labels are drawn once per row of panels, and layer
ticks are thinned, so no label runs into a neighbouring panel.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from weightgraft.localization.agreement import spearman
from weightgraft.report.figures import write_figure
from weightgraft.resume.manifests import SearchRecord

GLOBAL = ("embed", "final_norm", "unembed")
NO_CELL = "#d9d9d9"  # a label a template's prompts lack, or a global slot not at that position


def _cmap():
    """Red-blue diverging, with cells that do not exist in grey (not white, which reads as 0)."""
    import matplotlib

    return matplotlib.colormaps["RdBu_r"].with_extremes(bad=NO_CELL)


def label_order(cells: pd.DataFrame) -> list[str]:
    """Position labels in prompt order (by their mean position)."""
    return list(cells.groupby("position_label")["position"].mean().sort_values().index)


def _style_layers(ax, n_layers: int) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.set_xlim(-0.5, n_layers - 0.5)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("layer", fontsize=7)


def global_grid(cells: pd.DataFrame, column: str) -> pd.DataFrame:
    """Position label x (embed, final_norm, unembed): the mean of ``column``; NaN where a slot
    has no cell (final_norm and unembed exist at the last position only)."""
    glob = cells[cells["layer"].isna()]
    grid = glob.groupby(["position_label", "component"])[column].mean().unstack("component")
    return grid.reindex(index=label_order(cells), columns=[c for c in GLOBAL if c in set(glob["component"])])


def _scale(vmax: float) -> float:
    """A symmetric colour limit: the largest |value|, or 1 where there is none."""
    return vmax if vmax > 0 and vmax == vmax else 1.0


def heatmaps(cells: pd.DataFrame, column: str, title: str, path: Path) -> list[str]:
    """Position x layer per layer component, and position x (embed, final_norm, unembed);
    returns the panels drawn."""
    import matplotlib.pyplot as plt

    layered = cells[cells["layer"].notna()]
    components = list(dict.fromkeys(layered["component"]))
    labels = label_order(cells)
    n_layers = int(layered["layer"].max()) + 1 if len(layered) else 1
    mean = layered.groupby(["component", "position_label", "layer"])[column].mean()
    gmean = global_grid(cells, column)
    # the global slots (above all the unembedding) can be 10-100x any layer cell: each kind
    # gets its own colour scale, else the layer panels would all read as zero
    vmax = _scale(float(mean.abs().max()) if len(mean) else 0.0)
    gmax = _scale(float(gmean.abs().max().max()) if gmean.size else 0.0)
    panels = components + (["global"] if gmean.shape[1] else [])
    cols = min(len(panels), 5)
    rows = (len(panels) + cols - 1) // cols
    label_width = max((len(lab) for lab in labels), default=4) * 0.055 + 0.3
    height = max(2.2, 0.16 * len(labels) + 1.1)
    fig, axes = plt.subplots(rows, cols, figsize=(label_width + 2.4 * cols, height * rows + 0.8), squeeze=False,
                             layout="constrained")
    im = gim = None
    for k, (ax, comp) in enumerate(zip(axes.flat, panels)):
        if comp == "global":
            gim = ax.imshow(gmean.to_numpy(dtype=float), aspect="auto", cmap=_cmap(), vmin=-gmax, vmax=gmax)
            ax.set_xticks(range(gmean.shape[1]), gmean.columns, rotation=30, ha="right", fontsize=7)
            ax.set_title(" / ".join(gmean.columns), fontsize=8)
        else:
            grid = mean.loc[comp].unstack("layer").reindex(index=labels, columns=range(n_layers))
            im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap=_cmap(), vmin=-vmax, vmax=vmax)
            _style_layers(ax, n_layers)
            ax.set_title(comp, fontsize=9)
        if k % cols == 0:
            ax.set_yticks(range(len(labels)), labels, fontsize=6)
        else:
            ax.set_yticks(range(len(labels)), [""] * len(labels))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    layer_axes = [ax for ax, comp in zip(axes.flat, panels) if comp != "global"]
    if im is not None:
        fig.colorbar(im, ax=layer_axes, shrink=0.8, label=f"{column} (layer cells)")
    if gim is not None:
        fig.colorbar(gim, ax=list(axes.flat)[panels.index("global")], location="bottom", shrink=0.9,
                     label=f"{column} (global slots)")
    fig.suptitle(title, fontsize=10)
    write_figure(fig, path, dpi=100)
    plt.close(fig)
    return [" / ".join(gmean.columns) if p == "global" else p for p in panels]


def last_token(cells: pd.DataFrame, column: str, title: str, path: Path) -> None:
    """Layer x component at the last token, with its global slots beside."""
    import matplotlib.pyplot as plt

    last = cells[cells["position_label"] == "last"]
    layered = last[last["layer"].notna()]
    grid = layered.groupby(["layer", "component"])[column].mean().unstack("component")
    grid = grid[list(dict.fromkeys(layered["component"]))]
    glob = last[last["layer"].isna()].groupby("component")[column].mean()
    glob = glob.reindex([c for c in GLOBAL if c in glob.index])
    vmax = _scale(float(grid.abs().max().max()) if grid.size else 0.0)  # own scales, as in heatmaps
    gmax = _scale(float(glob.abs().max()) if len(glob) else 0.0)
    height = max(2.5, 0.16 * grid.shape[0] + 1.4)
    fig, (ax, gx) = plt.subplots(1, 2, figsize=(3.2 + 0.32 * grid.shape[1] + 1.2, height), layout="constrained",
                                 gridspec_kw={"width_ratios": [max(grid.shape[1], 1), max(len(glob), 1)]})
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap=_cmap(), vmin=-vmax, vmax=vmax)
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=45, ha="right", fontsize=7)
    step = max(1, grid.shape[0] // 16)
    ax.set_yticks(range(0, grid.shape[0], step), [int(x) for x in grid.index[::step]], fontsize=6)
    ax.set_ylabel("layer", fontsize=8)
    gim = gx.imshow(glob.to_numpy(dtype=float)[None, :], aspect="auto", cmap=_cmap(), vmin=-gmax, vmax=gmax)
    gx.set_xticks(range(len(glob)), glob.index, rotation=45, ha="right", fontsize=7)
    gx.set_yticks([])
    for j, v in enumerate(glob.to_numpy(dtype=float)):
        gx.text(j, 0, f"{v:.2g}", ha="center", va="center", fontsize=7, color="white" if abs(v) > 0.6 * gmax else "black")
    fig.colorbar(im, ax=ax, label=f"{column} (layer cells)")
    fig.colorbar(gim, ax=gx, label=f"{column} (global slots)")
    fig.suptitle(title, fontsize=9)
    write_figure(fig, path, dpi=100)
    plt.close(fig)


def scatter(cells: pd.DataFrame, path: Path) -> None:
    """Estimate against exact effect, per graft direction."""
    import matplotlib.pyplot as plt

    done = cells[cells["exact"].notna()]
    directions = list(dict.fromkeys(done["direction"]))
    fig, axes = plt.subplots(1, len(directions), figsize=(4.5 * len(directions), 4), squeeze=False,
                             layout="constrained")
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
    write_figure(fig, path, dpi=100)
    plt.close(fig)


def curves(search: SearchRecord, path: Path) -> None:
    """Exact share against cells grafted in attribution order; the refined set as a star, the
    random controls' 95th percentile as a cross."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.2), layout="constrained")
    for entry in search.searches:
        xs = [p["size"] for p in entry["curve"]]
        ys = [p["share"] for p in entry["curve"]]
        (line,) = ax.plot(xs, ys, marker=".", label=f"{entry['direction']} / {entry['template']} ({entry['size']} cells)")
        refined = entry.get("refined")
        if refined:
            ax.plot([refined["size"]], [refined["share"]], marker="*", ms=11, color=line.get_color(), ls="none")
        controls = entry.get("controls")
        if controls:
            ax.plot([entry["size"]], [controls["random"]["p95"]], marker="x", ms=8, color=line.get_color(), ls="none")
    targets = {e["target_share"] for e in search.searches}
    for t in targets:
        ax.axhline(t, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("cells grafted (in attribution order)")
    ax.set_ylabel("share of the finetuned effect (exact)")
    ax.legend(fontsize=7, title="* refined set, x random controls' p95", title_fontsize=7,
              loc="upper left", bbox_to_anchor=(1.02, 1.0))
    write_figure(fig, path, dpi=100)
    plt.close(fig)


def stability_label(row: pd.Series) -> str:
    """``sft[0] vs sft[1] (headline, sufficiency)`` (two models: SFT, SFT vs null, null) or
    ``headline vs qa (sft, sufficiency)``."""
    if row["kind"] != "template":
        return f"{row['model_a']} vs {row['model_b']} ({row['template_a']}, {row['direction']})"
    return f"{row['template_a']} vs {row['template_b']} ({row['model_a']}, {row['direction']})"


def stability(table: pd.DataFrame, path: Path) -> None:
    """One pair of bars per compared pair of maps: Spearman of the coarse maps and the
    overlap of the top cells (both 1 for identical maps)."""
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [stability_label(r) for _, r in table.iterrows()]
    y = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(8.5, 1.0 + 0.32 * len(labels)), layout="constrained")
    ax.barh(y - 0.2, table["spearman_coarse"].to_numpy(dtype=float), height=0.4, color="tab:blue",
            label="Spearman, coarse maps")
    ax.barh(y + 0.2, table["top_overlap"].to_numpy(dtype=float), height=0.4, color="tab:orange",
            label="top-k cell overlap")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(min(0.0, float(table["spearman_coarse"].min()) if len(table) else 0.0), 1.0)
    ax.axvline(0, color="grey", lw=0.8)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    write_figure(fig, path, dpi=100)
    plt.close(fig)
