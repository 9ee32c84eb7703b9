"""The summary as a table on the console."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_summary(summary: Any, title: str = "summary", console: Console | None = None) -> None:
    """The summary as a rich table: top-1 / top-5 (%) and mean rank per template and scheme."""
    table = Table(title=title)
    for col in ("model set", "template", "scheme", "n", "top-1 %", "top-5 %", "mean rank"):
        table.add_column(col, justify="right" if col in ("n", "top-1 %", "top-5 %", "mean rank") else "left")
    for row in summary.to_dict("records"):
        table.add_row(
            row["model_set"], row["template"], row["scheme"], str(row["n"]),
            f"{100 * row['top1']:.1f}", f"{100 * row['top5']:.1f}", f"{row['mean_rank']:.1f}",
        )
    (console or Console()).print(table)


