"""Reports on a run directory: markdown tables, figures like the paper's Figs. 2, 4 and 5,
and one self-contained HTML page with per-example top tokens (as in Appendix C.7).

Reads ``results.parquet`` (one row per model set, template, scheme and example),
``summary.csv`` (from :func:`weightgraft.experiments.metrics.summarize`) and ``manifest.json``.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Sequence

import pandas as pd

from weightgraft.report.run import (
    MAX_LISTED,
    ReportFigure,
    Run,
    _groups,
    group_title,
    model_rows,
    report_title,
)
from weightgraft.report.tables import (
    ANSWER_NOTE,
    CONTINUATION_HEADER,
    _exclusions,
    continuations,
    table_header,
    table_rows,
    weak_note,
)
from weightgraft.schemes.legend import legend

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2} .warn{color:#a40000;font-weight:bold}
code.tok{white-space:pre;background:#f6f6f6;padding:0 .2em}
mark.target{background:#ffd54f;outline:1px solid #c79a00}
figure{margin:1em 0} figure img{max-width:100%} figcaption{font-size:.85em;color:#555}
details{margin:.3em 0} summary{cursor:pointer} pre{background:#f6f6f6;padding:.5em;overflow:auto}
.p{color:#666;font-size:.85em}
h1{margin:0 0 .2em} .lead{margin:.2em 0;color:#444;overflow-wrap:anywhere}
.legend{margin:.2em 0 1em;font-size:.9em;color:#333} .legend b{font-family:ui-monospace,monospace}
.note{font-size:.85em;color:#555} .wide{overflow-x:auto}
.prov td{overflow-wrap:anywhere} .prov code.hash{white-space:nowrap}
"""
HASH_SHOWN = 12  # leading hex digits of a weights hash shown; the whole hash is its tooltip


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def html_table(header: Sequence[str], rows: Iterable[Sequence[str]], raw: bool = False,
               warn_col: int | None = None) -> str:
    """An HTML table; cells are escaped unless ``raw`` (cells already HTML)."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="warn"' if i == warn_col and cell else ""
            cells.append(f"<td{cls}>{cell if raw else _esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _token(text: object, target: str | None = None) -> str:
    shown = str(text).replace("\n", "\\n").replace("\t", "\\t")
    code = f'<code class="tok">{_esc(shown)}</code>'
    return f'<mark class="target">{code}</mark>' if str(text) == target else code


def _hash_cell(value: str) -> str:
    """A weights hash cut to its first digits, so the table fits the window; the whole hash is
    its tooltip (``title``)."""
    if len(value) <= HASH_SHOWN + 1:
        return _esc(value)
    return f'<code class="hash" title="{_esc(value)}">{_esc(value[:HASH_SHOWN])}…</code>'


def _header(run: Run) -> str:
    """The page's top: the sweep's name, what it compared, and what its scheme names mean."""
    specs = [f"{_esc(role)} <code>{_esc(spec)}</code>" if not ms or ms == "default"
             else f"{_esc(ms)}/{_esc(role)} <code>{_esc(spec)}</code>"
             for ms, role, spec, _, _ in model_rows(run.manifest)]
    shown = ", ".join(specs[:6]) + (f" and {len(specs) - 6} more" if len(specs) > 6 else "")
    lead = [f"weightgraft report; protocol <b>{_esc(run.manifest.protocol)}</b>"]
    if shown:
        lead.append(f"models: {shown}")
    lead.append('<a href="#provenance">provenance</a> (hashes, versions, config) at the end')
    parts = [f"<h1>{_esc(report_title(run))}</h1>", f'<p class="lead">{"; ".join(lead)}</p>']
    names = legend(dict.fromkeys(run.summary["scheme"].astype(str)))
    if names:
        items = " · ".join(f"<b>{_esc(abbr)}</b> = {_esc(meaning)}" for abbr, meaning in names)
        parts.append(f'<p class="legend" id="legend">Scheme names: {items}</p>')
    return "<header>" + "\n".join(parts) + "</header>"


def _provenance_section(run: Run) -> str:
    m = run.manifest
    parts = ['<section id="provenance" class="prov"><h2>Provenance</h2>',
             f"<p>directory: <code>{_esc(run.path)}</code>; started "
             f"{_esc(m.started or 'n/a')}, finished {_esc(m.finished or 'n/a')}</p>",
             f"<p>protocol: <b>{_esc(m.protocol)}</b>; {_esc(ANSWER_NOTE)}</p>"]
    models = [(*(_esc(c) for c in row[:4]), _hash_cell(row[4])) for row in model_rows(m)]
    if models:
        parts.append(html_table(("model set", "role", "spec", "source", "weights sha256"), models, raw=True))
    versions = m.versions
    if versions:
        parts.append(html_table(("package", "version"), [(k, v) for k, v in versions.items()]))
    config = json.dumps(m.config, indent=2, default=str)
    parts.append(f"<details><summary>config</summary><pre>{_esc(config)}</pre></details></section>")
    return "\n".join(parts)


def _summary_section(run: Run) -> str:
    parts = ['<section id="summary"><h2>Summary</h2>', "<p class='note'>Rates in percent with 95% Clopper-Pearson intervals (other means: t intervals; recovery: 95% held on every design of docs/statistics.md, Fieller's bounds at 99.99999%; an interval too few or too skewed rows cannot give is left out and the note says why); n counts "
             "rows with finite logits; non-finite rows are flagged and left out of every average.</p>"]
    for key, group in _groups(run.summary):
        parts.append(f"<h3>{_esc(group_title(key))}</h3>")
        header = table_header()
        parts.append(html_table(header, table_rows(group), warn_col=len(header) - 1))
        if weak_note(group):  # answers scored on a first token that does not identify them
            parts.append(f'<p class="warn">{_esc(weak_note(group))}</p>')
    conts = continuations(run)
    if conts is not None:
        parts += ["<h3>Grafted continuations (greedy)</h3>", html_table(CONTINUATION_HEADER, conts)]
    return "\n".join(parts) + "</section>"


def _figures_section(figures: Sequence[ReportFigure]) -> str:
    parts = ["<h2>Figures</h2>"]
    for f in figures:
        data = base64.b64encode(f.png.read_bytes()).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(f.title)}">'
                     f"<figcaption>{_esc(f.title)} ({_esc(f.png.name)} / {_esc(f.svg.name)})"
                     "</figcaption></figure>")
    return "\n".join(parts)


def _exclusions_section(run: Run) -> str:
    ex = _exclusions(run.manifest)
    parts = ["<h2>Exclusions</h2>", f"<p>Examples excluded before the run: <b>{ex['total']}</b></p>"]
    if ex["by_reason"]:
        parts.append(html_table(("reason", "count"), list(ex["by_reason"].items())))
    if ex["examples"]:
        shown = ex["examples"][:MAX_LISTED]
        rows = [(e.get("template", ""), e.get("example_id", ""), e.get("reason", "")) for e in shown]
        parts.append(f"<details><summary>excluded examples ({len(shown)} of {len(ex['examples'])} "
                     f"listed)</summary>{html_table(('template', 'example', 'reason'), rows)}</details>")
    bad = run.results[~run.results["finite"].astype(bool)]
    parts.append(f"<p>Rows with non-finite logits (left out of every average): <b>{len(bad)}</b></p>")
    if len(bad):
        rows = [(r.model_set, r.template, r.scheme, r.example_id) for r in bad.head(MAX_LISTED).itertuples()]
        parts.append(html_table(("model set", "template", "scheme", "example"), rows))
    return "\n".join(parts)


def _example_rows(ex: pd.DataFrame, top_n: int) -> list[tuple[str, ...]]:
    """HTML cells per scheme: target rank and probability, then the top tokens."""
    rows = []
    for r in ex.itertuples(index=False):
        target = str(r.target_token)
        if not bool(r.finite):
            rows.append((_esc(r.scheme), '<span class="warn">non-finite logits</span>', "", *[""] * top_n))
            continue
        toks = list(r.top_tokens if r.top_tokens is not None else [])[:top_n]
        probs = list(r.top_probs if r.top_probs is not None else [])[:top_n]
        cells = [f'{_token(t, target)}<br><span class="p">{float(p):.3f}</span>'
                 for t, p in zip(toks, probs, strict=False)]
        rows.append((_esc(r.scheme), _esc(int(r.rank)), f"{float(r.prob):.3f}",
                     *cells, *[""] * (top_n - len(cells))))
    return rows


def _examples_section(run: Run, max_examples: int, top_n: int) -> str:
    order = {s: i for i, s in enumerate(dict.fromkeys(run.summary["scheme"]))}
    header = ("scheme", "target rank", "target p", *[f"#{i + 1}" for i in range(top_n)])
    parts = ["<h2>Examples: top tokens per scheme</h2>",
             '<p>The target token is <mark class="target">highlighted</mark>; probabilities '
             "under each token.</p>"]
    for (ms, tpl), sub in run.results.groupby(["model_set", "template"], sort=False):
        ids = list(dict.fromkeys(sub["example_id"]))
        shown = ids[:max_examples]
        parts.append(f"<h3>{_esc(ms)} / {_esc(tpl)}</h3><p>showing {len(shown)} of {len(ids)} examples</p>")
        sub = sub[sub["example_id"].isin(shown)]
        for eid, ex in sub.groupby("example_id", sort=False):
            ex = ex.sort_values("scheme", key=lambda s: s.map(order), kind="stable")
            first = ex.iloc[0]
            title = (f"{_esc(eid)}: {_esc(first['prompt'])} → {_esc(first['answer'])} "
                     f"(target {_token(first['target_token'])})")
            parts.append(f'<details><summary>{title}</summary><div class="wide">'
                         f"{html_table(header, _example_rows(ex, top_n), raw=True)}</div></details>")
    return "\n".join(parts)


def report_html(run: Run, figures: Sequence[ReportFigure], max_examples: int = 50, top_n: int = 10) -> str:
    """The self-contained report page (figures embedded as base64 PNG): the result first (the
    sweep's name, its scheme names defined, the summary tables), provenance last."""
    body = "\n".join([
        _header(run), _summary_section(run), _figures_section(figures),
        _exclusions_section(run), _examples_section(run, max_examples, top_n), _provenance_section(run),
    ])
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_esc(report_title(run))}: weightgraft report</title><style>{CSS}</style></head>"
            f"<body>\n{body}\n</body></html>\n")
