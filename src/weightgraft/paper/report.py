"""The report of a ``weightgraft paper`` run: the numbers the paper states first, each beside ours
with its verdict (``numbers``: an equivalence test only on the paper's own model, the shape only
on any other, or why it was not run); the finetunes' preconditions (the control's the other way
round); each figure of the run drawn as the paper draws it, with every row of the paper beside
ours; the figures it did not run and why; the claims; the stage times. Written as ``paper.md``,
``paper.html`` and one PNG per figure beside them, from the stages' records only (the same
records give the same report)."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from weightgraft import atomic
from weightgraft.paper.charts import chart_digest, figure_chart, figure_rows, write_chart
from weightgraft.paper.figures import DROP, FINETUNES, NOT_RUN_REASONS, FigureRows, sweeps_for
from weightgraft.paper.measured import measured_of
from weightgraft.paper.numbers import (
    EQUIVALENCE_LEVEL,
    HEADER,
    PAPER_MODELS,
    Measured,
    MeasuredKey,
    PaperNumber,
    SideBySide,
    paper_numbers,
    side_by_side,
)
from weightgraft.paper.settings import precondition
from weightgraft.report.html import CSS, html_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from weightgraft.paper.settings import PaperRun

TIMES_HEADING = "Stage times"
CHART_DIGESTS = "paper-charts.json"  # each PNG's digest (charts.chart_digest): one already drawn is kept
STATED_HEADING = "The numbers the paper states"
NOT_MET = "precondition not met"


@dataclasses.dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Image:
    """A chart written as ``name`` (PNG) beside ``paper.html`` and embedded in it."""

    name: str
    caption: str
    digest: str
    draw: Callable[[], Figure] = dataclasses.field(compare=False, repr=False)


Block = Union[tuple[str, str], Table, Image]  # ("h1" | "h2" | "h3" | "p", text), a table or a chart


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


@dataclasses.dataclass
class _Figures:
    """What the run measured for each figure, and why each figure it has no value for was not run."""

    measured: dict[MeasuredKey, Measured] = dataclasses.field(default_factory=dict)
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)


def _figures(run: PaperRun, numbers: Sequence[PaperNumber]) -> _Figures:
    s = run.settings
    out = _Figures()
    for sweep in sweeps_for(s.world):
        if sweep.name not in s.sweeps:
            out.not_run.update(dict.fromkeys(sweep.figure_ids, f"sweep {sweep.name} not selected"))
        elif sweep.name in run.skipped:
            out.not_run.update(dict.fromkeys(sweep.figure_ids, f"{NOT_MET} ({run.skipped[sweep.name]})"))
        elif sweep.name in run.sweeps:
            record = run.sweeps[sweep.name]
            out.measured.update(measured_of(sweep, record["outputs"]["summary"], record["outputs"].get("drops")))
    ran = {fid for sw in sweeps_for(s.world) if sw.name in run.sweeps for fid in sw.figure_ids}
    for n in numbers:
        if n.figure_id not in ran and n.figure_id not in out.not_run:
            out.not_run[n.figure_id] = NOT_RUN_REASONS.get(n.figure_id, f"not a figure of world {s.world}")
    return out


def _intro(run: PaperRun) -> list[Block]:
    s = run.settings
    same = s.same_model()
    model_line = (f"The run's model is the paper's {same}: each number the paper states for {same} is tested for "
                  f"equivalence (TOST at 5% a side: `same model: equivalent` where our {EQUIVALENCE_LEVEL:.0%} "
                  f"interval lies within the paper's number +- {s.margin:g} points, a margin fixed in the settings "
                  "before the run; the finetune's recipe and world size are this run's, named above); a number "
                  "stated for another of the paper's models is compared in shape only (`other model: shape only`)."
                  if same else
                  f"The run's model is none of the paper's ({', '.join(PAPER_MODELS)}): no level is compared with "
                  "the paper's; each stated number says `other model: shape only` (read the order of the schemes "
                  "and which recover the answer, not the levels).")
    return [
        ("h1", f"The paper's numbers beside ours: {s.model}"),
        ("p", f"Nief et al., \"Multiple Streams of Knowledge Retrieval\": each number the paper states (or a bar it "
              f"shows without stating a value) beside ours on {s.model}, finetuned on world {s.world} "
              f"({s.relations} relations, world seed {s.seed}, training seed {s.train_seed}, preset {s.preset}"
              f"{f', at most {s.max_steps} steps' if s.max_steps else ''}; device {s.device}) and swept under the "
              "authors' protocol. A run has one model, so each row holds one measured value and names the paper's "
              "models in its cell. Units: top-5 accuracy in % of prompts with its 95% Clopper-Pearson interval; mean "
              "rank as our summary counts it (0 = the answer's first token is the most likely); a drop on the same "
              "prompts in points, with Newcombe's paired 95% interval (his method 10), and relative (% of the level "
              "with the component), with the 95% delta-method interval of the log ratio of the two rates."),
        ("p", model_line),
        ("p", "Fig. 4's drop without O: the paper writes that removing the O matrix \"harms top-5 accuracy by 29% in "
              "Gemma and 41% in Llama3\" and does not say whether in points or relative to the level with O; ours "
              "is given both ways, and on the paper's own model each reading is tested."),
    ]


def report_blocks(run: PaperRun) -> list[Block]:
    """The report, block by block (headings, paragraphs, tables, charts)."""

    s = run.settings
    numbers = paper_numbers()
    figs = _figures(run, numbers)
    model = s.same_model()

    def rows(figure_ids: set[str] | None = None) -> list[SideBySide]:
        return side_by_side(figs.measured, numbers, figure_ids=figure_ids, model=model, margin=s.margin,
                            not_run=figs.not_run)

    blocks = _intro(run)
    blocks.append(("h2", STATED_HEADING))
    blocks.append(_side_table([r for r in rows() if r.stated]))
    blocks += finetune_blocks(run)
    extras = []
    for sweep in sweeps_for(s.world):
        if sweep.name not in s.sweeps:
            continue
        if sweep.name in run.skipped:
            blocks.append(("h2", sweep.label))
            blocks.append(("p", f"Not run: {NOT_MET} ({run.skipped[sweep.name]})."))
            if sweep.figure_ids:
                blocks.append(_side_table(rows(set(sweep.figure_ids))))
            continue
        summary = run.sweeps[sweep.name]["outputs"]["summary"]
        if not sweep.figures:
            extras.append((sweep, summary))
            continue
        blocks.append(("h2", sweep.label))
        for fig in sweep.figures:
            blocks.append(("h3", fig.label))
            if figure_rows(fig, summary):
                blocks.append(_image(fig, summary, numbers, s.model))
            blocks.append(_side_table(rows({fig.figure_id})))
    figure_names = {n.figure_id: n.figure for n in numbers}
    shown = {fid: why for fid, why in figs.not_run.items() if not why.startswith(NOT_MET)}
    blocks.append(("h2", "Figures not run"))
    blocks.append(Table(("figure", "paper rows", "why"),
                        [(f"{fid} ({figure_names[fid]})", str(sum(n.figure_id == fid for n in numbers)), why)
                         for fid, why in shown.items() if fid in figure_names]))
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
    if run.shuffled_data is not None:
        times.append(("data", run.shuffled_data["name"], run.shuffled_data["key"][:12],
                      f"{run.shuffled_data['seconds']:.1f}", _reused(run, "data shuffled")))
    times += [(f"finetune {n}", FINETUNES[n].split, r["key"][:12], f"{r['seconds']:.1f}", _reused(run, f"finetune {n}"))
              for n, r in run.finetunes.items()]
    times += [(f"sweep {n}", "", r["key"][:12], f"{r['seconds']:.1f}", _reused(run, f"sweep {n}"))
              for n, r in run.sweeps.items()]
    if run.claims is not None:
        times.append(("claims", "", run.claims["key"][:12], f"{run.claims['seconds']:.1f}", _reused(run, "claims")))
    blocks.append(Table(("stage", "what", "key", "seconds (when it ran)", "this run"), times))
    return blocks


def _image(fig: FigureRows, summary: list[dict[str, Any]], numbers: Sequence[PaperNumber], model: str) -> Image:
    marks = [n for n in numbers if n.figure_id == fig.figure_id and n.stated]
    said = ("; the paper's stated values marked" if any(n.metric != DROP for n in marks) else "") + \
           ("; its stated drop named in the legend" if any(n.metric == DROP for n in marks) else "")
    what = "mean target rank per scheme" if fig.metric != "top-5 accuracy" else \
        "top-5 accuracy per scheme with its 95% interval"
    return Image(f"paper-{fig.figure_id}.png", f"{fig.label}: {what} on {model}{said}.",
                 chart_digest(fig, summary, numbers, model), lambda: figure_chart(fig, summary, numbers, model))


def finetune_blocks(run: PaperRun) -> list[Block]:
    """Each finetune's precondition; the control's is the other way round (it must not know the
    facts), and a control that knows them is flagged."""
    s = run.settings
    rows: list[tuple[str, ...]] = []
    flags: list[Block] = []
    for name, record in run.finetunes.items():
        finetune = FINETUNES[name]
        ok, line = precondition(s, finetune, record)
        split = f"{finetune.split}, answers shuffled among the subjects" if finetune.shuffled else finetune.split
        rows.append((name, split, "met" if ok else NOT_MET, line.partition(": ")[2]))
        if finetune.shuffled and not ok:
            flags.append(("p", f"Flag: the control finetune knows the facts ({line.partition(': ')[2]}). Its "
                               "precondition is a low trained-direction top-5 (it was taught each answer of another "
                               "subject); the claims' control test then compares the a2b finetune with a donor that "
                               "names the true answer."))
    return [("h2", "Finetunes and their preconditions"),
            Table(("finetune", "split", "precondition", "top-5 on its test prompts (the world's true answers)"), rows),
            *flags]


def _share(row: dict[str, Any]) -> str:
    share, lo, hi = row.get("share_exact"), row.get("ci_low"), row.get("ci_high")
    if share is None:
        return "n/a"
    return f"{share:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else " (no interval)")


def _p(row: dict[str, Any], column: str, floor: float | None) -> str:
    """A p as localize prints it: at its floor (the least p its test can reach), ``<= floor``."""
    from weightgraft.localization.claims.verdicts import p_text

    value = row.get(column)
    if value is None:
        return "n/a"
    return p_text(value, floor) if floor is not None else f"{value:.3g}"


def _floors(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """The row's least reachable p: Holm-adjusted at its family's size, and unadjusted."""
    least, family = row.get("least_p"), row.get("family_size")
    if least is None:
        return None, None
    return (min(1.0, family * least) if family else None), least


def _control_note(run: PaperRun) -> list[Block]:
    record = run.finetunes.get("control")
    if record is None:
        return [("p", "No control finetune in this run: the fact claims are judged against their nulls only.")]
    s = run.settings
    ok, line = precondition(s, FINETUNES["control"], record)
    said = (f"at most {100 * s.control_top5:.0f}%, its precondition" if ok else
            f"above {100 * s.control_top5:.0f}%: flagged above, the control knows facts it was not taught")
    return [("p", f"The control finetune was used (`models.control`): the a2b finetune's recipe (split a2b, preset "
                  f"{s.preset}, training seed {s.train_seed}, the same training templates) on the same world and seed "
                  "with each answer moved to another subject. Each fact claim of the a2b finetune (`sft`) is tested "
                  "against the same region grafted from it, prompt by prompt (`control p`; its rows are the "
                  "`control` donor's, `null finetune`). Its own trained-direction top-5 on the world's true facts: "
                  f"{line.partition(': ')[2]} ({said}).")]


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
                        "the same region grafted from the control finetune; Holm-adjusted once over the run. A p at the "
                        "least its test can reach prints as `<= floor`. Holds: Holm p <= 0.05; fails: interval on the "
                        "other side of the threshold; undecided otherwise (the reason names the largest part). Rows of "
                        "claims 4-5 on PRE -> SFT are outside the paper's setting (the paper made them for both "
                        "directions -> a2b on reversed prompts, the rows `both->a2b`)."))
    blocks += _control_note(run)
    rows = []
    for r in run.claims["outputs"]["claims"]:
        holm_floor, floor = _floors(r)
        rows.append((str(r.get("claim")), str(r.get("statement", "")), str(r.get("model")), str(r.get("setting")),
                     "yes" if r.get("in_paper_setting") else "no", str(r.get("template")),
                     f"{r['n_prompts']:.0f}" if r.get("n_prompts") is not None else "",
                     f"{r.get('side', '')} {r['threshold']:g}" if r.get("threshold") is not None else "",
                     _share(r), _p(r, "p_holm", holm_floor),
                     _p(r, "control_p", floor) if r.get("control_p") is not None else "",
                     str(r.get("verdict")) + (" (exploratory)" if r.get("evidence") == "exploratory" else ""),
                     str(r.get("reason") or "")))
    blocks.append(Table(("claim", "statement", "donor", "setting", "paper's setting", "template", "prompts",
                         "threshold", "share [95% CI]", "p (Holm)", "control p", "verdict", "why"), rows))
    return blocks


def _reused(run: PaperRun, name: str) -> str:
    return "reused" if name in run.reused else "ran"


def _side_table(rows: Sequence[SideBySide]) -> Table:
    return Table(HEADER, [r.cells() for r in rows])


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


HEADINGS = {"h1": "# ", "h2": "## ", "h3": "### ", "p": ""}


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            out.append("| " + " | ".join(b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.caption}]({b.name})", ""]
        else:
            kind, text = b
            out += [HEADINGS[kind] + text, ""]
    return "\n".join(out)


def _code(escaped: str) -> str:
    """Markdown's `code` spans of a paragraph as ``<code>`` in the page."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)


def _img(folder: Path, image: Image) -> str:
    data = base64.b64encode((folder / image.name).read_bytes()).decode("ascii")
    caption = html.escape(image.caption)
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{caption}">'
            f"<figcaption>{caption} ({html.escape(image.name)})</figcaption></figure>")


def to_html(blocks: Sequence[Block], folder: Path) -> str:
    """The page, each chart embedded from its PNG in ``folder``."""
    body: list[str] = []
    title = ""
    for b in blocks:
        if isinstance(b, Table):
            body.append(html_table(b.header, b.rows))
        elif isinstance(b, Image):
            body.append(_img(folder, b))
        else:
            kind, text = b
            title = title or text
            body.append(f"<{kind}>{_code(html.escape(text))}</{kind}>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_paper_report(run: PaperRun) -> Path:
    """``paper.md``, ``paper.html`` and each figure's PNG in the run's folder (a PNG already drawn
    from the same inputs, by its digest in ``paper-charts.json``, is kept); returns the markdown's
    path."""
    blocks = report_blocks(run)
    folder = Path(run.settings.out)
    try:
        drawn = json.loads((folder / CHART_DIGESTS).read_text())
    except (OSError, ValueError):
        drawn = {}
    for b in blocks:
        if isinstance(b, Image) and not (drawn.get(b.name) == b.digest and (folder / b.name).is_file()):
            write_chart(b.draw(), folder / b.name)
            drawn[b.name] = b.digest
            atomic.write_json(folder / CHART_DIGESTS, drawn, indent=1, sort_keys=True)
    path = folder / "paper.md"
    atomic.write_text(path, to_markdown(blocks))
    atomic.write_text(path.with_suffix(".html"), to_html(blocks, folder))
    return path


def side_by_side_part(text: str) -> str:
    """The report's text before its stage times (what a resumed run must give again)."""
    return text.split(f"## {TIMES_HEADING}")[0]
