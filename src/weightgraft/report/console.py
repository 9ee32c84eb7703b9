"""The summary as a table on the console."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def print_summary(summary: Any, title: str = "summary", console: Console | None = None) -> None:
    """The summary as a rich table: top-1 / top-5 (%) and mean rank per template, direction
    and scheme. Names are never cut: long ones wrap within their cell."""
    has_direction = "direction" in summary and (summary["direction"].astype(str) != "").any()
    table = Table(title=title)
    names = ["model set", "template", *(["direction"] if has_direction else []), "scheme"]
    for col in names:
        table.add_column(col, overflow="fold")
    for col in ("n", "top-1 %", "top-5 %", "mean rank"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in summary.to_dict("records"):
        keys = [str(row["model_set"]), str(row["template"]),
                *([str(row["direction"])] if has_direction else []), str(row["scheme"])]
        table.add_row(
            *(Text(k) for k in keys), str(row["n"]),  # Text: "o[3]@..." is a name, not markup
            f"{100 * row['top1']:.1f}", f"{100 * row['top5']:.1f}", f"{row['mean_rank']:.1f}",
        )
    (console or Console()).print(table)
