"""Summary tables: percentages with confidence intervals, markdown."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from weightgraft.engine.metric_table import MetricSpec, table_metrics
from weightgraft.experiments.answer_tokens import weak_line
from weightgraft.report.run import Run, _groups, group_title, report_title
from weightgraft.resume.manifests import SweepManifest
from weightgraft.schemes.legend import legend


def format_pct_ci(p: float, lo: float | None = None, hi: float | None = None) -> str:
    """A rate as percent with its interval: ``87.5 [75.0, 97.5]``; ``n/a`` when undefined."""
    if p is None or not math.isfinite(p):
        return "n/a"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{100 * p:.1f}"
    return f"{100 * p:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _fmt_rank(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.1f}"


def nonfinite_flag(n_nonfinite: int) -> str:
    """Text flagging rows left out of the averages for non-finite logits."""
    return f"⚠ {n_nonfinite} non-finite, excluded" if n_nonfinite else ""


def table_header() -> tuple[str, ...]:
    """The summary table's columns: scheme, family, n, every shown metric, non-finite rows."""
    return ("scheme", "family", "n", *(str(m.header) for m in table_metrics()), "non-finite")


def _fmt_mean_ci(row: Any, metric: str, value: str | None = None) -> str:
    """``1.23 [0.90, 1.60]`` of a behaviour metric (column ``value``, default ``mean_<metric>``),
    with its note where it has one (``⚠ unstable: ...``); ``n/a`` where the sweep does not
    define it."""
    mean = getattr(row, value or f"mean_{metric}", float("nan"))
    if mean is None or not isinstance(mean, (int, float)) or not math.isfinite(mean):
        return "n/a"
    lo, hi = getattr(row, f"{metric}_lo", float("nan")), getattr(row, f"{metric}_hi", float("nan"))
    text = f"{mean:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else f"{mean:.2f}"
    note = getattr(row, f"{metric}_note", "")
    return text + (f" ⚠ {note}" if isinstance(note, str) and note else "")


def _shown(row: Any, spec: MetricSpec) -> str:
    """One metric's cell, as its ``shown`` kind writes it."""
    column = spec.summary_columns()[0]
    if spec.shown == "pct_ci":
        return format_pct_ci(getattr(row, column), getattr(row, f"{spec.name}_lo"), getattr(row, f"{spec.name}_hi"))
    if spec.shown == "number":
        return _fmt_rank(getattr(row, column))
    return _fmt_mean_ci(row, spec.name, column)


def weak_note(group: pd.DataFrame) -> str:
    """``⚠ N of M answers are scored on a first token shared ...`` for one (model set,
    template) summary, pointing at the whole-answer recovery; "" when none is (or an older
    summary does not count them). Every scheme scores the same answers: the largest count is
    the group's."""
    if "n_weak_first_token" not in group or group.empty:
        return ""
    weak = group["n_weak_first_token"].fillna(0)
    if not weak.max() > 0:
        return ""
    at = int(weak.to_numpy().argmax())
    return (f"⚠ {weak_line(int(weak.iloc[at]), int(group['n'].iloc[at]))}: their first-token metrics "
            "(top-k, rank, first-token recovery, logit diff) may credit another answer; read the "
            "whole-answer recovery beside them")


def table_rows(group: pd.DataFrame) -> list[tuple[str, ...]]:
    """Display cells of one (model_set, template) summary, in scheme order."""
    shown = table_metrics()
    return [
        (str(r.scheme), str(r.family), str(int(r.n)), *(_shown(r, m) for m in shown), nonfinite_flag(int(r.n_nonfinite)))
        for r in group.itertuples(index=False)
    ]


CONTINUATION_HEADER = ("model set", "scheme", "prompt", "continuation")


def continuations(run: Run) -> list[tuple[str, ...]] | None:
    """Rows of ``continuations.csv`` (greedy grafted continuations), if the run wrote one."""
    path = run.path / "continuations.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, keep_default_na=False)
    return [(str(r.model_set), str(r.scheme), str(r.prompt),
             str(r.continuation) if not r.error else f"not generated: {r.error}")
            for r in frame.itertuples(index=False)]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table (``|`` in cells escaped)."""
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _exclusions(manifest: SweepManifest) -> dict[str, Any]:
    ex = manifest.exclusions
    return {"total": int(ex.get("total", 0)), "by_reason": dict(ex.get("by_reason") or {}),
            "examples": list(ex.get("examples") or [])}


ANSWER_NOTE = ("answer log-probability: the answer's tokens follow the prompt and are grafted "
               "as its last token, as in generation with a KV cache")


def summary_markdown(run: Run) -> str:
    """summary.md: a table per (model_set, template), non-finite flags, exclusions."""
    parts = [f"# {report_title(run)}: weightgraft report", "",
             f"Protocol: {run.manifest.protocol}; {ANSWER_NOTE}.", ""]
    names = legend(dict.fromkeys(run.summary["scheme"].astype(str)))
    if names:
        parts += ["Scheme names: " + "; ".join(f"`{abbr}` = {meaning}" for abbr, meaning in names) + ".", ""]
    for key, group in _groups(run.summary):
        parts += [f"## {group_title(key)}", "", markdown_table(table_header(), table_rows(group)), ""]
        if weak_note(group):
            parts += [f"> {weak_note(group)}", ""]
        bad = group[group["n_nonfinite"] > 0]
        if len(bad):
            parts += [f"> ⚠ non-finite logits: {int(bad['n_nonfinite'].sum())} row(s) in "
                      f"{', '.join(bad['scheme'])}; left out of every average (n counts finite "
                      "rows only).", ""]
    conts = continuations(run)
    if conts is not None:
        parts += ["## Grafted continuations", "", markdown_table(CONTINUATION_HEADER, conts), ""]
    ex = _exclusions(run.manifest)
    parts += ["## Exclusions", "", f"Examples excluded before the run: {ex['total']}", ""]
    if ex["by_reason"]:
        parts += [markdown_table(("reason", "count"),
                                 [(str(k), str(v)) for k, v in ex["by_reason"].items()]), ""]
    skipped = run.manifest.exclusions.get("skipped_schemes") or []
    if skipped:
        parts += ["Schemes not run on a template that never has their span: "
                  + "; ".join(f"{s['template']}: {s['scheme']} ({s['span']})" for s in skipped), ""]
    return "\n".join(parts)
