"""The summary as a table on the console."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def print_summary(summary: Any, title: str = "summary", console: Console | None = None) -> None:
    """The summary as a rich table: top-1 / top-5 (%), mean rank and first-token recovery per
    template, direction and scheme. Names are never cut: long ones wrap within their cell."""
    has_direction = "direction" in summary and (summary["direction"].astype(str) != "").any()
    table = Table(title=title)
    names = ["model set", "template", *(["direction"] if has_direction else []), "scheme"]
    for col in names:
        table.add_column(col, overflow="fold")
    has_recovery = "recovery" in summary and summary["recovery"].notna().any()
    for col in ("n", "top-1 %", "top-5 %", "mean rank"):
        table.add_column(col, justify="right", no_wrap=True)
    if has_recovery:
        table.add_column("recovery [95% CI]", justify="right", overflow="fold")
    for row in summary.to_dict("records"):
        keys = [str(row["model_set"]), str(row["template"]),
                *([str(row["direction"])] if has_direction else []), str(row["scheme"])]
        table.add_row(
            *(Text(k) for k in keys), str(row["n"]),  # Text: "o[3]@..." is a name, not markup
            f"{100 * row['top1']:.1f}", f"{100 * row['top5']:.1f}", f"{row['mean_rank']:.1f}",
            *([Text(_recovery(row))] if has_recovery else []),
        )
    (console or Console()).print(table)


def _recovery(row: dict[str, Any]) -> str:
    """``0.44 [0.31, 0.58]``, flagged where the summary says it is unstable."""
    value, lo, hi = row.get("recovery"), row.get("recovery_lo"), row.get("recovery_hi")
    if value is None or value != value:
        return "n/a"
    note = row.get("recovery_note") or ""
    text = f"{value:.2f} [{lo:.2f}, {hi:.2f}]" if lo == lo and hi == hi else f"{value:.2f}"
    return text + (f" ⚠ {note}" if isinstance(note, str) and note else "")
