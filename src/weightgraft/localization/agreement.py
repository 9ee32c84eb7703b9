"""How well estimates rank cells the way exact effects do: Spearman correlation at the cell
level and at a coarse level (position span x layer quarter x component), and top-k overlap."""

from __future__ import annotations

import math

import pandas as pd

from weightgraft.schemes.labels import label_group

ESTIMATES = ("estimate", "estimate_ig")


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rho: Pearson's correlation of the (tie-averaged) ranks. Twice a tie-averaged
    rank is an integer, so the sums are exact and only the last division rounds: identical
    orders give exactly 1 (and reversed ones -1) on every machine, whatever the summation order."""
    both = pd.DataFrame({"a": a.to_numpy(dtype=float), "b": b.to_numpy(dtype=float)}).dropna()
    if len(both) < 2:
        return float("nan")
    n = len(both)
    ra, rb = ((both[c].rank() * 2).astype("int64").tolist() for c in ("a", "b"))
    ca = [n * x - sum(ra) for x in ra]  # n times the centred ranks: still integers
    cb = [n * x - sum(rb) for x in rb]
    cov, va, vb = sum(x * y for x, y in zip(ca, cb)), sum(x * x for x in ca), sum(y * y for y in cb)
    if va == 0 or vb == 0:
        return float("nan")
    rho = cov / va if va == vb else cov / math.sqrt(va * vb)
    return max(-1.0, min(1.0, rho))


def span_of(label: str) -> str:
    """``first_entity_last-2`` / ``relation_last+1`` / ``relation_last#2`` -> their span
    (``first_entity``, ``relation``); ``tok3`` -> ``other``."""
    return label_group(label)[0]


def coarse(cells: pd.DataFrame, n_layers: int, columns: list[str]) -> pd.DataFrame:
    """Per example: ``columns`` summed over (span, layer quarter, component) groups."""
    frame = cells.copy()
    frame["span"] = frame["position_label"].map(span_of)
    layer = frame["layer"].astype("float")
    frame["quarter"] = (layer * 4 // max(n_layers, 1)).fillna(-1).astype(int)
    keys = ["example_id", "template", "direction", "span", "quarter", "component"]
    return frame.groupby(keys, as_index=False)[columns].sum(min_count=1)


def _topk_overlap(frame: pd.DataFrame, column: str, k: int) -> float:
    """Mean over examples of |top-k by |estimate| & top-k by |exact|| / k."""
    shares = []
    for _, g in frame.groupby(["example_id", "direction"]):
        kk = min(k, len(g))
        top_e = set(g[column].abs().nlargest(kk).index)
        top_x = set(g["exact"].abs().nlargest(kk).index)
        shares.append(len(top_e & top_x) / kk if kk else float("nan"))
    return float(pd.Series(shares).mean()) if shares else float("nan")


def agreement(cells: pd.DataFrame, n_layers: int, k: int = 20) -> pd.DataFrame:
    """One row per (direction, estimator): Spearman at cell and coarse level, top-k overlap,
    on the cells whose exact effect was computed (no rows where the run took no estimates)."""
    done = cells[cells["exact"].notna()]
    rows = []
    columns = [c for c in ESTIMATES if c in done and done[c].notna().any()]  # none with estimates: false
    if done.empty:
        return pd.DataFrame(rows)
    grouped = coarse(done, n_layers, columns + ["exact"])
    for direction, sub in done.groupby("direction"):
        g = grouped[grouped["direction"] == direction]
        for col in columns:
            rows.append({
                "direction": direction, "estimator": "gradient" if col == "estimate" else "integrated gradients",
                "n_cells": len(sub), "spearman_cell": spearman(sub[col], sub["exact"]),
                "spearman_coarse": spearman(g[col], g["exact"]),
                f"top{k}_overlap": _topk_overlap(sub, col, k),
            })
    return pd.DataFrame(rows)
