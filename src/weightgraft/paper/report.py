"""The report of a ``weightgraft paper`` run: for each figure it ran, every number of the paper
(``numbers.csv``) beside ours with its interval; the figures it did not run and why; the
finetunes' preconditions; the stage times. Written as ``paper.md`` and ``paper.html``, from the
stages' records only (the same records give the same report)."""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from weightgraft import atomic
from weightgraft.paper.figures import FINETUNES, NOT_RUN_REASONS, sweeps_for
from weightgraft.paper.measured import measured_of
from weightgraft.paper.numbers import HEADER, SideBySide, paper_numbers, side_by_side
from weightgraft.paper.settings import precondition
from weightgraft.report.html import CSS, html_table

if TYPE_CHECKING:
    from weightgraft.paper.settings import PaperRun

TIMES_HEADING = "Stage times"
NOT_MET = "precondition not met"


@dataclasses.dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


Block = Union[tuple[str, str], Table]  # ("h1" | "h2" | "p", text) or a table


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def report_blocks(run: PaperRun) -> list[Block]:
    """The report, block by block (headings, paragraphs, tables)."""

    s = run.settings
    blocks: list[Block] = [
        ("h1", f"The paper's numbers beside ours: {s.model}"),
        ("p", f"Nief et al., \"Multiple Streams of Knowledge Retrieval\": each number the paper states (or a bar it "
              f"shows without stating a value) beside ours on {s.model}, finetuned on world {s.world} "
              f"({s.relations} relations, world seed {s.seed}, training seed {s.train_seed}, preset {s.preset}"
              f"{f', at most {s.max_steps} steps' if s.max_steps else ''}; device {s.device}) and swept under the "
              "authors' protocol. The paper's models are 1-2.8 B parameters finetuned with its own recipe; ours is one "
              "model, so one measured value stands beside the row of every paper model. Ours: top-5 accuracy in % "
              "with its 95% interval; mean rank as our summary counts it (0 = the answer's first token is the most "
              "likely); a drop in points on the same prompts, with its paired 95% interval (Newcombe)."),
        ("h2", "Finetunes and their preconditions"),
    ]
    rows: list[tuple[str, ...]] = []
    for name, record in run.finetunes.items():
        ok, line = precondition(s, FINETUNES[name], record)
        rows.append((name, FINETUNES[name].split, "met" if ok else NOT_MET, line.partition(": ")[2]))
    blocks.append(Table(("finetune", "split", "precondition", "top-5 of the finetune on its own facts"), rows))
    numbers = paper_numbers()
    not_run: dict[str, str] = {}
    extras = []
    for sweep in sweeps_for(s.world):
        if sweep.name not in s.sweeps:
            for fid in sweep.figure_ids:
                not_run[fid] = f"sweep {sweep.name} not selected"
            continue
        if sweep.name in run.skipped:
            blocks.append(("h2", sweep.label))
            blocks.append(("p", f"Not run: {NOT_MET} ({run.skipped[sweep.name]})."))
            if sweep.figure_ids:
                marked = [dataclasses.replace(r, ours=NOT_MET)
                          for r in side_by_side({}, numbers, figure_ids=set(sweep.figure_ids))]
                blocks.append(_side_table(marked))
            continue
        record = run.sweeps[sweep.name]
        summary = record["outputs"]["summary"]
        if not sweep.figures:
            extras.append((sweep, summary))
            continue
        blocks.append(("h2", sweep.label))
        measured = measured_of(sweep, summary, record["outputs"].get("drops"))
        blocks.append(_side_table(side_by_side(measured, numbers, figure_ids=set(sweep.figure_ids))))
    run_ids = {fid for name, r in run.sweeps.items() for sw in sweeps_for(s.world) if sw.name == name
               for fid in sw.figure_ids}
    skipped_ids = {fid for sw in sweeps_for(s.world) if sw.name in run.skipped for fid in sw.figure_ids}
    for n in numbers:
        fid = n.figure_id
        if fid not in run_ids and fid not in skipped_ids and fid not in not_run:
            not_run[fid] = NOT_RUN_REASONS.get(fid, f"not a figure of world {s.world}")
    figure_names = {n.figure_id: n.figure for n in numbers}
    blocks.append(("h2", "Figures not run"))
    blocks.append(Table(("figure", "paper rows", "why"),
                        [(f"{fid} ({figure_names[fid]})", str(sum(n.figure_id == fid for n in numbers)), why)
                         for fid, why in not_run.items()]))
    for sweep, summary in extras:
        blocks.append(("h2", sweep.label))
        blocks.append(Table(("template", "direction", "scheme", "n", "top-5 (ours)"),
                            [(r["template"], r["direction"], r["scheme"], f"{r['n']:.0f}" if r["n"] is not None else "",
                              _pct(r["top5"]) + (f" [{100 * r['top5_lo']:.1f}, {100 * r['top5_hi']:.1f}]"
                                                 if r["top5_lo"] is not None and r["top5_hi"] is not None else ""))
                             for r in summary]))
    blocks += claims_blocks(run)
    blocks.append(("h2", TIMES_HEADING))
    times = [("data", s.world, run.data["key"][:12], f"{run.data['seconds']:.1f}", _reused(run, "data"))]
    times += [(f"finetune {n}", FINETUNES[n].split, r["key"][:12], f"{r['seconds']:.1f}", _reused(run, f"finetune {n}"))
              for n, r in run.finetunes.items()]
    times += [(f"sweep {n}", "", r["key"][:12], f"{r['seconds']:.1f}", _reused(run, f"sweep {n}"))
              for n, r in run.sweeps.items()]
    if run.claims is not None:
        times.append(("claims", "", run.claims["key"][:12], f"{run.claims['seconds']:.1f}", _reused(run, "claims")))
    blocks.append(Table(("stage", "what", "key", "seconds (when it ran)", "this run"), times))
    return blocks


def _share(row: dict[str, Any]) -> str:
    share, lo, hi = row.get("share_exact"), row.get("ci_low"), row.get("ci_high")
    if share is None:
        return "n/a"
    return f"{share:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else " (no interval)")


def claims_blocks(run: PaperRun) -> list[Block]:
    """The paper's claims as judged by the claims stage (``claims.csv``'s rows), or why not."""
    blocks: list[Block] = [("h2", "The paper's claims, judged")]
    if not run.settings.claims:
        return blocks + [("p", "Not run: --no-claims.")]
    if "claims" in run.skipped:
        return blocks + [("p", f"Not judged: {NOT_MET} ({run.skipped['claims']}).")]
    if run.claims is None:
        return blocks + [("p", "Not judged: no a2b finetune in this run.")]
    blocks.append(("p", "Each claim's region grafted whole, exactly, in every prompt (`weightgraft localize`'s "
                        "claims; docs/localize.md): its share of the fact-specific effect (`fact_logprob`: the answer's "
                        "log-probability minus the mean over the world's other answers; the plain first-token effect "
                        "beside it) with a per-row 95% Fieller interval. A row's p is the largest of its parts: the "
                        "threshold test, a paired test against a null region of its kind and, for fact claims, against "
                        "the same region grafted from the control finetune where the run has one; Holm-adjusted once "
                        "over the run. Holds: Holm p <= 0.05; fails: interval on the other side of the threshold; "
                        "undecided otherwise (the reason names the largest part). Rows of claims 4-5 "
                        "on PRE -> SFT are outside the paper's setting (the paper made them for both directions -> "
                        "a2b on reversed prompts, the rows `both->a2b`)."))
    rows = [(str(r.get("claim")), str(r.get("statement", "")), str(r.get("model")), str(r.get("setting")),
             "yes" if r.get("in_paper_setting") else "no", str(r.get("template")),
             f"{r['n_prompts']:.0f}" if r.get("n_prompts") is not None else "",
             f"{r.get('side', '')} {r['threshold']:g}" if r.get("threshold") is not None else "",
             _share(r), f"{r['p_holm']:.3g}" if r.get("p_holm") is not None else "n/a",
             str(r.get("verdict")) + (" (exploratory)" if r.get("evidence") == "exploratory" else ""),
             str(r.get("reason") or ""))
            for r in run.claims["outputs"]["claims"]]
    blocks.append(Table(("claim", "statement", "donor", "setting", "paper's setting", "template", "prompts",
                         "threshold", "share [95% CI]", "null p (Holm)", "verdict", "why"), rows))
    return blocks


def _reused(run: PaperRun, name: str) -> str:
    return "reused" if name in run.reused else "ran"


def _side_table(rows: Sequence[SideBySide]) -> Table:
    return Table(HEADER, [(r.figure, r.model, r.scheme, r.metric, r.paper, r.ours) for r in rows])


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            out.append("| " + " | ".join(b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        else:
            kind, text = b
            out += [{"h1": "# ", "h2": "## ", "p": ""}[kind] + text, ""]
    return "\n".join(out)


def _code(escaped: str) -> str:
    """Markdown's `code` spans of a paragraph as ``<code>`` in the page."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)


def to_html(blocks: Sequence[Block]) -> str:

    body: list[str] = []
    title = ""
    for b in blocks:
        if isinstance(b, Table):
            body.append(html_table(b.header, b.rows))
        else:
            kind, text = b
            title = title or text
            tag = {"h1": "h1", "h2": "h2", "p": "p"}[kind]
            body.append(f"<{tag}>{_code(html.escape(text))}</{tag}>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_paper_report(run: PaperRun) -> Path:
    """``paper.md`` and ``paper.html`` in the run's folder; returns the markdown's path."""
    blocks = report_blocks(run)
    path = Path(run.settings.out) / "paper.md"
    atomic.write_text(path, to_markdown(blocks))
    atomic.write_text(path.with_suffix(".html"), to_html(blocks))
    return path


def side_by_side_part(text: str) -> str:
    """The report's text before its stage times (what a resumed run must give again)."""
    return text.split(f"## {TIMES_HEADING}")[0]
