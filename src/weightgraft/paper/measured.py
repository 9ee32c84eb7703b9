"""Our numbers, keyed as the paper's table keys its own: from a sweep's summary (kept in its
``stage.json``) to ``{(figure_id, scheme, metric): Measured}``.

Top-5 accuracy is in % with the summary's 95% interval (``weightgraft.stats``' interval of a
rate, ``top5_lo`` / ``top5_hi``); the mean rank is ours as the summary has it (0 = the answer's
first token is the most likely; no interval); a drop (Fig. 4's "removing the O matrix") is the
difference of two top-5 accuracies in points, without an interval.
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


def measured_of(sweep: Sweep, rows: list[dict[str, Any]]) -> dict[MeasuredKey, Measured]:
    """Every number of ``sweep``'s figures, from its summary rows."""
    out: dict[MeasuredKey, Measured] = {}
    for fig in sweep.figures:
        for scheme, row in _find(rows, fig.template, fig.direction).items():
            if fig.metric == TOP5:
                out[(fig.figure_id, scheme, TOP5)] = _top5(row)
            elif fig.metric == RANK:
                rank = row.get("mean_rank")
                out[(fig.figure_id, scheme, RANK)] = Measured(float("nan") if rank is None else rank, unit="")
    for figure_id, pair, template, direction in sweep.drops:
        without, with_ = pair.split(" vs ")
        found = _find(rows, template, direction)
        if without in found and with_ in found:
            a, b = found[with_].get("top5"), found[without].get("top5")
            drop = float("nan") if a is None or b is None else 100 * (a - b)
            out[(figure_id, pair, DROP)] = Measured(drop)
    return out
