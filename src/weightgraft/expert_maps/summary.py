"""An expert map read across prompts: per region (the first entity's tokens, the last token),
layer and expert, how often the router picks the expert and its mean exact effect with its
interval, each finetune's row beside the control's.

Why per region and not per position: the first entity spans a different number of tokens in each
prompt, so its cells are summed over the region's tokens per prompt (an effect per prompt, as the
claims' regions are), and the mean over prompts is taken of those sums. A cell the router did not
pick is an exact zero in that sum, not a missing value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from weightgraft.stats.means import mean_interval

__all__ = ["REGIONS", "region_of", "summarize", "top_cells"]

REGIONS = ("first_entity", "last")


def region_of(label: str) -> str | None:
    """The region a position label belongs to: ``first_entity`` (any of its tokens), ``last``, or
    None (a position no region names)."""
    if label == "last":
        return "last"
    if label == "first_entity" or label.startswith("first_entity_last"):
        return "first_entity"
    return None


def summarize(cells: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """One row per (model, template, region, layer, expert): ``n_prompts``, ``pick_rate`` (the
    share of the region's tokens where the serving router picks it), ``effect`` the mean over
    prompts of the region's summed exact effect, with ``ci_low`` / ``ci_high`` (t interval at
    ``level``; NaN and a ``declined`` reason where the interval is declined), ``effect_plain``.

    ``cells`` holds ``expert_map`` rows with ``model``, ``template``, ``example_id`` and
    ``region`` columns added."""
    keys = ["model", "template", "region", "layer", "expert"]
    per_prompt = (cells.groupby(keys + ["example_id"], sort=False)
                  .agg(effect=("effect", "sum"), effect_plain=("effect_plain", "sum"), picks=("picked", "sum"),
                       tokens=("picked", "size"))
                  .reset_index())
    rows = []
    for key, g in per_prompt.groupby(keys, sort=False):
        interval = mean_interval(g["effect"].to_numpy(dtype=float), level=level)
        rows.append({**dict(zip(keys, key)), "n_prompts": len(g), "pick_rate": float(g["picks"].sum() / g["tokens"].sum()),
                     "effect": interval.value, "ci_low": interval.low, "ci_high": interval.high,
                     "level": level, "declined": interval.declined, "effect_plain": float(g["effect_plain"].mean())})
    return pd.DataFrame(rows)


def top_cells(summary: pd.DataFrame, *, model: str, beside: Sequence[str] = (), k: int = 10) -> pd.DataFrame:
    """``model``'s ``k`` cells of largest mean effect per (template, region), with each model of
    ``beside`` (the control finetune) in the same cells: its ``effect[...]`` and interval."""
    mine = summary[summary["model"] == model]
    top = (mine.sort_values("effect", ascending=False).groupby(["template", "region"], sort=False).head(k)
           .sort_values(["template", "region", "effect"], ascending=[True, True, False]))
    keys = ["template", "region", "layer", "expert"]
    for other in beside:
        theirs = summary[summary["model"] == other].set_index(keys)[["effect", "ci_low", "ci_high", "pick_rate"]]
        theirs = theirs.add_suffix(f"[{other}]")
        top = top.join(theirs, on=keys)
    return top.reset_index(drop=True)


def concentration(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (model, template, region): the total of the cells' mean effects, and the share of it in
    the 1, 2, 4 and 8 cells of largest effect (a descriptive share of summed single-cell effects,
    not the effect of grafting those cells together)."""
    rows = []
    for key, g in summary.groupby(["model", "template", "region"], sort=False):
        effects = np.sort(g["effect"].to_numpy(dtype=float))[::-1]
        total = float(effects.sum())
        row: dict = dict(zip(["model", "template", "region"], key))
        row.update(cells=len(effects), total=total)
        for k in (1, 2, 4, 8):
            row[f"top{k}_share"] = float(effects[:k].sum() / total) if total > 0 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def with_regions(frame: pd.DataFrame, labels: Mapping[tuple[str, int], str]) -> pd.DataFrame:
    """``frame`` with its ``region`` from ``labels`` ((example_id, position) -> position label)."""
    region = [region_of(labels[(e, int(p))]) for e, p in zip(frame["example_id"], frame["position"])]
    return frame.assign(region=region)
