"""The summary as a table on the console."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from weightgraft.engine.metric_table import MetricSpec, console_metrics
from weightgraft.experiments.answer_tokens import weak_line


def print_summary(summary: Any, *, protocol: str, title: str = "summary", console: Console | None = None) -> None:
    """The summary as a rich table: the metrics ``engine.metric_table`` puts on the console (its
    ``console`` entries: top-1 / top-5 (%), mean rank, first-token and whole-answer recovery
    with their 95% CIs) per template, direction and scheme (and a line counting the
    answers whose first token is shared or short, where the two recoveries can disagree). A model set or direction that is the same on
    every row goes into the title instead of a column, after the grafting ``protocol`` (the
    same schemes give other numbers under the other one). Names are never cut: long ones wrap
    within their cell. A recovery the summary flags as unstable carries a numbered mark, and
    each distinct note is printed once under the table (in the cell it would take a line per
    word at 80 columns)."""
    keys = [("model_set", "model set"), ("template", "template"), ("direction", "direction"), ("scheme", "scheme")]
    shown, fixed = [], [f"protocol {protocol}"]
    for col, label in keys:
        values = summary[col].astype(str).unique() if col in summary else []
        if col in ("model_set", "direction") and len(values) <= 1:
            if len(values) and values[0]:
                fixed.append(f"{label} {values[0]}")
            continue
        shown.append((col, label))
    table = Table(title=f"{title} ({', '.join(fixed)})")
    for _, label in shown:
        table.add_column(label, overflow="fold")
    metrics = [m for m in console_metrics() if _has(summary, m)]
    table.add_column("n", justify="right", no_wrap=True)
    for m in metrics:
        if m.shown == "mean_ci":
            table.add_column(m.console, justify="right", overflow="fold")
        else:
            table.add_column(m.console, justify="right", no_wrap=True)
    notes: dict[str, int] = {}
    for row in summary.to_dict("records"):
        table.add_row(  # Text: "o[3]@..." is a name, not markup
            *(Text(str(row[col])) for col, _ in shown), str(row["n"]), *(_cell(row, m, notes) for m in metrics))
    console = console or Console()
    console.print(table)
    for note, mark in notes.items():
        console.print(Text(f"⚠{mark} {note}"))
    weak = _weak(summary)
    if weak:
        console.print(Text(f"⚠ {weak}: read the whole-answer recovery beside the first-token one"))


def _weak(summary: Any) -> str:
    """The weakly scored answers' line, summed over the (model set, template, direction)
    groups (each scheme of a group scores the same answers: its largest count)."""
    if "n_weak_first_token" not in summary or not (summary["n_weak_first_token"].fillna(0) > 0).any():
        return ""
    keys = [k for k in ("model_set", "template", "direction") if k in summary]
    top = summary.sort_values("n_weak_first_token", ascending=False).drop_duplicates(keys)
    return weak_line(int(top["n_weak_first_token"].sum()), int(top["n"].sum()))


def _has(summary: Any, m: MetricSpec) -> bool:
    """A metric has a console column where the summary holds its value (one with an interval:
    where any row has one)."""
    column = m.summary_columns()[0]
    return column in summary and (m.shown != "mean_ci" or bool(summary[column].notna().any()))


def _cell(row: dict[str, Any], m: MetricSpec, notes: dict[str, int]) -> Text:
    """One metric's console cell, as its ``shown`` kind writes it."""
    value = row[m.summary_columns()[0]]
    if m.shown == "pct_ci":
        return Text(f"{100 * value:.1f}")
    if m.shown == "number":
        return Text(f"{value:.1f}")
    return Text(_recovery(row, notes, m.name, m.summary_columns()[0]))


def _recovery(row: dict[str, Any], notes: dict[str, int], name: str = "recovery", column: str | None = None) -> str:
    """``0.44`` over ``[0.31, 0.58]`` (of ``name``, e.g. ``recovery``; its value in ``column``,
    default ``name``), with the number of its note where the summary says it is unstable
    (``notes`` gains the note)."""
    value, lo, hi = row.get(column or name), row.get(f"{name}_lo"), row.get(f"{name}_hi")
    if value is None or value != value:
        return "n/a"
    note = row.get(f"{name}_note") or ""
    text = f"{value:.2f}\n[{lo:.2f}, {hi:.2f}]" if lo == lo and hi == hi else f"{value:.2f}"
    if not isinstance(note, str) or not note:
        return text
    return f"{text} ⚠{notes.setdefault(note, len(notes) + 1)}"
