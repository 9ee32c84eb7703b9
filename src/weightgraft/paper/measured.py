"""Our numbers, keyed as the paper's table keys its own: from a sweep's summary (kept in its
``stage.json``) to ``{(figure_id, scheme, metric): Measured}``.

Top-5 accuracy is in % with the summary's 95% interval (``weightgraft.stats``' interval of a
rate, ``top5_lo`` / ``top5_hi``) and its 90% Clopper-Pearson interval (what the equivalence
test reads); the mean rank is ours as the summary has it (0 = the answer's first token is the
most likely; no interval); a drop (Fig. 4's "removing the O matrix") is the difference of two
top-5 accuracies on the same prompts, in points with Newcombe's paired interval (his method 10,
``weightgraft.stats.paired_table_ci``), and relative to the level with the component (1 - the
ratio of the two rates, with the delta-method interval of the log ratio on the same prompts),
from the prompts' 2x2 table kept in the sweep's record as ``drops``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from weightgraft.paper.figures import DROP, RANK, TOP5, Sweep
from weightgraft.paper.numbers import EQUIVALENCE_LEVEL, Measured, MeasuredKey

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


def _n(row: dict[str, Any]) -> int | None:
    n = row.get("n")
    return None if n is None else int(n)


def _top5(row: dict[str, Any]) -> Measured:
    from weightgraft.stats import rate_ci

    value, n = row.get("top5"), _n(row)
    lo, hi = row.get("top5_lo"), row.get("top5_hi")
    low90 = high90 = None
    if value is not None and n:
        _, a, b = rate_ci(round(value * n), n, level=EQUIVALENCE_LEVEL)
        low90, high90 = 100 * a, 100 * b
    return Measured(value=float("nan") if value is None else 100 * value,
                    low=None if lo is None else 100 * lo, high=None if hi is None else 100 * hi,
                    n=n, low90=low90, high90=high90)


def relative_drop_ci(both: int, with_only: int, without_only: int, neither: int, *,
                     level: float = 0.95) -> tuple[float, float, float]:
    """``1 - rate_without / rate_with`` of two rates on the same prompts, with the delta-method
    interval of the log ratio, var = (with_only + without_only) / ((both + with_only)(both +
    without_only)); 0.5 is added to every cell for the interval where one of the three is 0.
    NaN where nothing is hit with the component."""
    from scipy.stats import norm

    if both + with_only == 0:
        return float("nan"), float("nan"), float("nan")
    point = 1 - (both + without_only) / (both + with_only)
    a, b, c = float(both), float(with_only), float(without_only)
    if min(a, b, c) == 0:
        a, b, c = a + 0.5, b + 0.5, c + 0.5
    log_ratio = math.log((a + c) / (a + b))
    half = norm.ppf(0.5 + level / 2) * math.sqrt((b + c) / ((a + b) * (a + c)))
    return point, 1 - math.exp(log_ratio + half), 1 - math.exp(log_ratio - half)


def drop_measured(d: dict[str, Any]) -> Measured:
    """A drop's record (:func:`drop_rows`) in points and relative, each with its 95% and 90%
    intervals; a record without the prompts' table has its 95% interval in points only."""
    from weightgraft.stats.rates import paired_table_ci

    value = d["drop"]
    points = float("nan") if value is None else value
    table = d.get("table")
    if not table:
        return Measured(points, d.get("low"), d.get("high"), unit="points", n=d.get("n"))
    _, lo90, hi90 = paired_table_ci(*table, level=EQUIVALENCE_LEVEL)
    rel, rlo, rhi = relative_drop_ci(*table)
    _, rlo90, rhi90 = relative_drop_ci(*table, level=EQUIVALENCE_LEVEL)
    relative = Measured(100 * rel, _number(100 * rlo), _number(100 * rhi), unit="% relative",
                        low90=_number(100 * rlo90), high90=_number(100 * rhi90))
    return Measured(points, d.get("low"), d.get("high"), unit="points", n=d.get("n"),
                    low90=_number(100 * lo90), high90=_number(100 * hi90), relative=relative)


def drop_rows(sweep: Sweep, results: pd.DataFrame) -> list[dict[str, Any]]:
    """Each of ``sweep``'s drops from its per-prompt results: top-5 with the component minus
    top-5 without it on the prompts both schemes scored, with its paired interval (in points),
    and the prompts' 2x2 table (hit by both, with the component only, without it only, neither)."""
    from weightgraft.stats import paired_rate_difference_ci

    out = []
    for figure_id, pair, template, direction in sweep.drops:
        without, with_ = pair.split(" vs ")
        rows = results[(results["template"] == template) & (results["direction"] == direction)]
        if "finite" in rows.columns:
            rows = rows[rows["finite"].astype(bool)]
        hits = {name: rows[rows["scheme"] == name].set_index("example_id")["top5"] for name in (with_, without)}
        common = hits[with_].index.intersection(hits[without].index)
        a = hits[with_].loc[common].astype(bool).to_numpy()
        b = hits[without].loc[common].astype(bool).to_numpy()
        drop, low, high = paired_rate_difference_ci(a, b)
        table = [int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()), int((~a & ~b).sum())]
        out.append({"figure_id": figure_id, "pair": pair, "template": template, "direction": direction,
                    "n": int(len(common)), "drop": _number(100 * drop), "low": _number(100 * low),
                    "high": _number(100 * high), "table": table})
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
                out[(fig.figure_id, scheme, RANK)] = Measured(float("nan") if rank is None else rank, unit="",
                                                              n=_n(row))
    for d in drops or []:
        out[(d["figure_id"], d["pair"], DROP)] = drop_measured(d)
    for figure_id, pair, template, direction in sweep.drops:
        if (figure_id, pair, DROP) in out:
            continue
        without, with_ = pair.split(" vs ")
        found = _find(rows, template, direction)
        if without in found and with_ in found:
            a, b = found[with_].get("top5"), found[without].get("top5")
            drop = float("nan") if a is None or b is None else 100 * (a - b)
            out[(figure_id, pair, DROP)] = Measured(drop, unit="points")
    return out
