"""Our numbers, keyed as the paper's table keys its own: from a sweep's summary (kept in its
``stage.json``) to ``{(figure_id, scheme, metric): Measured}``.

Top-5 accuracy is in % with the summary's 95% interval (``weightgraft.stats``' interval of a
rate, ``top5_lo`` / ``top5_hi``); the mean rank is ours as the summary has it (0 = the answer's
first token is the most likely; no interval); a drop (Fig. 4's "removing the O matrix") is the
difference of two top-5 accuracies on the same prompts, in points, with Newcombe's paired 95%
interval (``weightgraft.stats.paired_rate_difference_ci``), kept in the sweep's record as
``drops``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from weightgraft.paper.figures import DROP, RANK, TOP5, Sweep
from weightgraft.paper.numbers import Measured, MeasuredKey

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_COLUMNS = ("template", "direction", "scheme", "n", "top1", "top5", "top5_lo", "top5_hi", "mean_rank")


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def summary_rows(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary's columns the report reads, one dict per (template, direction, scheme)."""
    rows = []
    for rec in summary.to_dict("records"):
        row: dict[str, Any] = {c: str(rec.get(c, "") or "") for c in ("template", "direction", "scheme")}
        row.update({c: _number(rec.get(c)) for c in SUMMARY_COLUMNS[3:]})
        rows.append(row)
    return rows


def _find(rows: Iterable[dict[str, Any]], template: str, direction: str) -> dict[str, dict[str, Any]]:
    return {r["scheme"]: r for r in rows if r["template"] == template and r["direction"] == direction}


def _top5(row: dict[str, Any]) -> Measured:
    value = row.get("top5")
    lo, hi = row.get("top5_lo"), row.get("top5_hi")
    return Measured(value=float("nan") if value is None else 100 * value,
                    low=None if lo is None else 100 * lo, high=None if hi is None else 100 * hi)


def drop_rows(sweep: Sweep, results: pd.DataFrame) -> list[dict[str, Any]]:
    """Each of ``sweep``'s drops from its per-prompt results: top-5 with the component minus
    top-5 without it on the prompts both schemes scored, with its paired interval (in points)."""
    from weightgraft.stats import paired_rate_difference_ci

    out = []
    for figure_id, pair, template, direction in sweep.drops:
        without, with_ = pair.split(" vs ")
        rows = results[(results["template"] == template) & (results["direction"] == direction)]
        if "finite" in rows.columns:
            rows = rows[rows["finite"].astype(bool)]
        hits = {name: rows[rows["scheme"] == name].set_index("example_id")["top5"] for name in (with_, without)}
        common = hits[with_].index.intersection(hits[without].index)
        drop, low, high = paired_rate_difference_ci(hits[with_].loc[common].astype(bool).to_numpy(),
                                                    hits[without].loc[common].astype(bool).to_numpy())
        out.append({"figure_id": figure_id, "pair": pair, "template": template, "direction": direction,
                    "n": int(len(common)), "drop": _number(100 * drop), "low": _number(100 * low),
                    "high": _number(100 * high)})
    return out


def measured_of(sweep: Sweep, rows: list[dict[str, Any]],
                drops: list[dict[str, Any]] | None = None) -> dict[MeasuredKey, Measured]:
    """Every number of ``sweep``'s figures, from its summary rows and its ``drops``
    (:func:`drop_rows`; a record without them gives each drop without an interval)."""
    out: dict[MeasuredKey, Measured] = {}
    for fig in sweep.figures:
        for scheme, row in _find(rows, fig.template, fig.direction).items():
            if fig.metric == TOP5:
                out[(fig.figure_id, scheme, TOP5)] = _top5(row)
            elif fig.metric == RANK:
                rank = row.get("mean_rank")
                out[(fig.figure_id, scheme, RANK)] = Measured(float("nan") if rank is None else rank, unit="")
    for d in drops or []:
        value = d["drop"]
        out[(d["figure_id"], d["pair"], DROP)] = Measured(float("nan") if value is None else value, d["low"], d["high"])
    for figure_id, pair, template, direction in sweep.drops:
        if (figure_id, pair, DROP) in out:
            continue
        without, with_ = pair.split(" vs ")
        found = _find(rows, template, direction)
        if without in found and with_ in found:
            a, b = found[with_].get("top5"), found[without].get("top5")
            drop = float("nan") if a is None or b is None else 100 * (a - b)
            out[(figure_id, pair, DROP)] = Measured(drop)
    return out
