"""The report of a ``weightgraft paper`` run: the numbers the paper states first, each beside ours
with its verdict (``numbers``: an equivalence test only on the paper's own model, the shape only
on any other, or why it was not run); the finetunes' preconditions (the control's the other way
round); each figure of the run drawn as the paper draws it, with every row of the paper beside
ours; the figures it did not run and why; the claims; the stage times. Written as ``paper.md``,
``paper.html`` and one PNG per figure beside them, from the stages' records only (the same
records give the same report). With several training seeds each row also gives every seed's value
and says where its verdict is not the same on every seed, and each claim its verdicts across
the seeds.

This module lays the sections out in order and writes the files; the rows across seeds are
``paper.seed_tables``'s, the claims section ``paper.report_claims``'s, and the blocks and their
markdown and HTML ``paper.page``'s."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightgraft import atomic
from weightgraft.data.general_text import CORPUS
from weightgraft.paper.appendix import appendix_blocks
from weightgraft.paper.charts import chart_digest, figure_chart, figure_rows, write_chart
from weightgraft.paper.figures import (
    DEFAULT_SWEEPS,
    DROP,
    FINETUNES,
    MAIN_WORLD,
    SWEEP_NAMES,
    FigureRows,
    Finetune,
    sweeps_for,
)
from weightgraft.paper.numbers import EQUIVALENCE_LEVEL, PAPER_MODELS, PAPER_NAMES, Measured, PaperNumber, paper_numbers
from weightgraft.paper.page import Block, Image, Table, to_html, to_markdown
from weightgraft.paper.report_claims import claims_blocks, rules_of
from weightgraft.paper.seed_tables import (
    DIFFERS,
    LIST_SEEDS,
    NOT_MET,
    SPREAD_HEADING,
    seed_figures,
    seed_spread,
    seed_table,
)
from weightgraft.paper.settings import PaperSettings, precondition, seed_label, seeds_text
from weightgraft.paper.trajectory import trajectory_blocks
from weightgraft.report.blocks import wrap

if TYPE_CHECKING:
    from weightgraft.paper.settings import PaperRun

TIMES_HEADING = "Stage times"
CHART_DIGESTS = "paper-charts.json"  # each PNG's digest (charts.chart_digest): one already drawn is kept
STATED_HEADING = "The numbers the paper states"
# The paper as arXiv v3 and ICLR 2026 title it; the authors' blog post (and arXiv v1-v2) had another.
PAPER_TITLE = ("Nief, Reber, Richardson, Holtzman, \"Dynamic Weight Grafting: Localizing Finetuned Factual Knowledge "
               "in Transformers\" (arXiv 2506.20746 v3, ICLR 2026; earlier titled \"Multiple Streams of Knowledge "
               "Retrieval\")")


def paper_models_text() -> str:
    """``Gemma 2B (gemma-1.1-2b-it), ...``: each model as the paper names it, then as its code does."""
    return ", ".join(f"{PAPER_NAMES.get(m, m)} ({m})" for m in PAPER_MODELS)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _intro(run: PaperRun) -> list[Block]:
    s = run.settings
    same = s.same_model()
    model_line = (f"The run's model is the paper's {same}: each number the paper states for {same} is tested for "
                  f"equivalence (TOST at 5% a side: `same model: equivalent` where our {EQUIVALENCE_LEVEL:.0%} "
                  f"interval lies within the paper's number +- {s.margin:g} points, a margin fixed in the settings "
                  "before the run; the finetune's recipe and world size are this run's, named above); a number "
                  "stated for another of the paper's models is compared in shape only (`other model: shape only`)."
                  if same else
                  f"The run's model is none of the paper's ({paper_models_text()}; the rows name each by the "
                  "authors' code's id): no level is compared with "
                  "the paper's; each stated number says `other model: shape only` (read the order of the schemes "
                  "and which recover the answer, not the levels).")
    first = s.train_seed
    if s.seeds == 1:
        seeds_line = (f"Training seeds: K = 1 (seed {first}). Every figure and claim below rests on one finetune per "
                      "role; how far a row moves with the training seed is not measured in this run (`--seeds K` "
                      "trains K finetunes per role).")
    else:
        seeds_line = (f"Training seeds: K = {s.seeds} (seeds {', '.join(map(str, s.train_seeds))}). Each finetune role "
                      "was trained once per seed and each figure's sweep ran on every seed's finetunes that meet their "
                      f"preconditions. Each row gives seed {first}'s value with its 95% interval across prompts and, "
                      f"in `{SPREAD_HEADING}`, each seed's value without its interval (their min–max and mean beyond "
                      f"{LIST_SEEDS} seeds); a row whose verdict is not the same on every seed says `{DIFFERS}`.")
    trained = (f"training seed {first}" if s.seeds == 1 else
               f"training seeds {first}-{first + s.seeds - 1}")
    return [
        ("h1", f"The paper's numbers beside ours: {s.model}"),
        ("p", seeds_line),
        ("p", f"{PAPER_TITLE}: each number the paper states (or a bar it "
              f"shows without stating a value) beside ours on {s.model}, finetuned on world {s.world} "
              f"({s.relations} relations, world seed {s.seed}, {trained}, preset {s.preset}"
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
    seeds = run.by_seed()
    per_seed = {seed: seed_figures(s, records, numbers) for seed, records in seeds.items()}
    figs = per_seed[s.train_seed]
    model = s.same_model()

    def table(figure_ids: set[str] | None = None, stated_only: bool = False) -> Table:
        return seed_table(per_seed, numbers, first=s.train_seed, model=model, margin=s.margin, figure_ids=figure_ids,
                          stated_only=stated_only)

    blocks = _intro(run)
    blocks.append(("h2", STATED_HEADING))
    blocks.append(table(stated_only=True))
    blocks += finetune_blocks(run)
    extras = []
    for sweep in sweeps_for(s.world):
        if sweep.name not in s.sweeps:
            continue
        skipped = {seed: r.skipped[sweep.name] for seed, r in seeds.items() if sweep.name in r.skipped}
        ran = [seed for seed, r in seeds.items() if sweep.name in r.sweeps]
        if not ran:
            why = "; ".join(skipped.values()) if s.seeds == 1 else \
                "; ".join(f"training seed {seed}: {line}" for seed, line in skipped.items())
            blocks.append(("h2", sweep.label))
            blocks.append(("p", f"Not run: {NOT_MET} ({why})."))
            if sweep.figure_ids:
                blocks.append(table(set(sweep.figure_ids)))
            continue
        drawn = ran[0]  # the first seed it ran on: the first seed's, where it ran
        summary = seeds[drawn].sweeps[sweep.name].outputs.summary
        notes: list[Block] = [("p", f"Not run on {seeds_text(list(skipped))}: {NOT_MET} ("
                                    + "; ".join(f"training seed {seed}: {line}" for seed, line in skipped.items())
                                    + f"); run on {seeds_text(ran)}.")] if skipped else []
        if not sweep.figures:
            extras.append((sweep, notes))
            continue
        blocks.append(("h2", sweep.label))
        blocks += notes
        for fig in sweep.figures:
            blocks.append(("h3", fig.label))
            if figure_rows(fig, summary):
                blocks.append(_image(fig, summary, numbers, s.model, drawn if s.seeds > 1 else None))
            blocks.append(table({fig.figure_id}))
    figure_names = {n.figure_id: n.figure for n in numbers}
    shown = {fid: why for fid, why in figs.not_run.items() if not why.startswith(NOT_MET)}
    blocks.append(("h2", "Figures not run"))
    blocks.append(Table(("figure", "paper rows", "why"),
                        [(f"{fid} ({figure_names[fid]})", str(sum(n.figure_id == fid for n in numbers)), why)
                         for fid, why in shown.items() if fid in figure_names]))
    for sweep, notes in extras:
        blocks.append(("h2", sweep.label))
        blocks += notes
        blocks.append(_extra_table(run, sweep.name))
    blocks += trajectory_blocks(run)
    blocks += appendix_blocks(run)
    blocks += claims_blocks(run)
    blocks.append(("h2", TIMES_HEADING))
    times = [("data", s.world, run.data.key[:12], f"{run.data.seconds:.1f}", _reused(run, "data"))]
    if run.shuffled_data is not None:
        times.append(("data", run.shuffled_data.name, run.shuffled_data.key[:12],
                      f"{run.shuffled_data.seconds:.1f}", _reused(run, "data shuffled")))
    for seed, records in seeds.items():
        label = seed_label(s, seed)
        times += [(f"finetune {n}{label}", FINETUNES[n].split, r.key[:12], f"{r.seconds:.1f}",
                   _reused(run, f"finetune {n}{label}")) for n, r in records.finetunes.items()]
    for seed, records in seeds.items():
        label = seed_label(s, seed)
        times += [(f"sweep {n}{label}", "", r.key[:12], f"{r.seconds:.1f}", _reused(run, f"sweep {n}{label}"))
                  for n, r in records.sweeps.items()]
    if run.claims is not None:
        times.append(("claims", "", run.claims.key[:12], f"{run.claims.seconds:.1f}", _reused(run, "claims")))
    blocks.append(Table(("stage", "what", "key", "seconds (when it ran)", "this run"), times))
    return blocks


def _top5_text(r: dict[str, Any]) -> str:
    return _pct(r["top5"]) + (f" [{100 * r['top5_lo']:.1f}, {100 * r['top5_hi']:.1f}]"
                              if r["top5_lo"] is not None and r["top5_hi"] is not None else "")


def _extra_table(run: PaperRun, name: str) -> Table:
    """A sweep the paper states no number for: top-5 per scheme, the first seed it ran on with
    its interval and, with several seeds, each seed's."""
    seeds = run.by_seed()
    ran = {seed: {(r["template"], r["direction"], r["scheme"]): r for r in records.sweeps[name].outputs.summary}
           for seed, records in seeds.items() if name in records.sweeps}
    first = next(iter(ran))
    header: tuple[str, ...] = ("template", "direction", "scheme", "n", "top-5 (ours)")
    rows = []
    for key, r in ran[first].items():
        row: tuple[str, ...] = (*key, f"{r['n']:.0f}" if r["n"] is not None else "", _top5_text(r))
        if len(seeds) > 1:
            values = {seed: (None if seed not in ran or key not in ran[seed] else
                             Measured(float("nan") if ran[seed][key]["top5"] is None else 100 * ran[seed][key]["top5"]))
                      for seed in seeds}
            row = (*row, seed_spread(values))
        rows.append(row)
    if len(seeds) > 1:
        header = (*header[:4], f"top-5 (ours, training seed {first})", f"top-5 {SPREAD_HEADING}")
    return Table(header, rows)


def _image(fig: FigureRows, summary: list[dict[str, Any]], numbers: Sequence[PaperNumber], model: str,
           seed: int | None = None) -> Image:
    marks = [n for n in numbers if n.figure_id == fig.figure_id and n.stated]
    said = ("; the paper's stated values marked, each its own model's level (named in the legend)"
            if any(n.metric != DROP for n in marks) else "") + \
           ("; its stated drop named in the legend" if any(n.metric == DROP for n in marks) else "")
    what = "mean target rank per scheme" if fig.metric != "top-5 accuracy" else \
        "top-5 accuracy per scheme with its 95% interval"
    finetuned = "" if seed is None else f" (the finetunes of training seed {seed})"
    return Image(f"paper-{fig.figure_id}.png", f"{fig.label}: {what} on {model}{finetuned}{said}.",
                 chart_digest(fig, summary, numbers, model), lambda: figure_chart(fig, summary, numbers, model))


def _recipe(settings: PaperSettings, finetune: Finetune) -> str:
    """The preset a finetune trained with, and for Fig. 13's the general text it mixed in."""
    preset = settings.preset_of(finetune)
    return f"{preset}, with general text ({CORPUS}) mixed in" if finetune.gentle else preset


def finetune_blocks(run: PaperRun) -> list[Block]:
    """Each finetune's precondition (with several training seeds, each seed's, and the roles
    whose precondition some seeds meet and others do not, by seed); the control's is the other
    way round (it must not know the facts), and a control that knows them is flagged."""
    s = run.settings
    several = s.seeds > 1
    rows: list[tuple[str, ...]] = []
    flags: list[Block] = []
    met: dict[str, dict[bool, list[int]]] = {}
    for seed, records in run.by_seed().items():
        for name, record in records.finetunes.items():
            finetune = FINETUNES[name]
            ok, line = precondition(s, finetune, record)
            met.setdefault(name, {True: [], False: []})[ok].append(seed)
            split = f"{finetune.split}, answers shuffled among the subjects" if finetune.shuffled else finetune.split
            rows.append((name, *([str(seed)] if several else []), split, _recipe(s, finetune), "met" if ok else NOT_MET,
                         line.partition(": ")[2]))
            if finetune.shuffled and not ok:
                on = f" of training seed {seed}" if several else ""
                flags.append(("p", f"Flag: the control finetune{on} knows the facts ({line.partition(': ')[2]}). Its "
                                   "precondition is a low trained-direction top-5 (it was taught each answer of "
                                   "another subject); the claims' control test then compares the a2b finetune with a "
                                   "donor that names the true answer."))
    mixed: list[Block] = [("p", f"{name}: precondition met on {seeds_text(by[True])}, not met on {seeds_text(by[False])}.")
                          for name, by in met.items() if by[True] and by[False]]
    header = ("finetune", *(["training seed"] if several else []), "split", "recipe", "precondition",
              "top-5 on its test prompts (the world's true answers)")
    return [("h2", "Finetunes and their preconditions"), Table(header, rows), *mixed, *flags]


def _reused(run: PaperRun, name: str) -> str:
    return "reused" if name in run.reused else "ran"


def block_name(settings: PaperSettings) -> str:
    """The name of the report's generated block (``paper-smollm2-135m``; an appendix world's run
    adds its world): the name docs/paper.md gives the block it splices in."""
    model = "".join(c if c.isalnum() or c in "._-" else "-" for c in settings.model.rstrip("/").rsplit("/", 1)[-1])
    return f"paper-{model}" + ("" if settings.world == MAIN_WORLD else f"-{settings.world}")


def paper_command(settings: PaperSettings) -> str:
    """The ``weightgraft paper`` command that makes this report again: its options that differ from
    the defaults (finished stages are reused, keyed by their inputs, so it only writes the report
    where every stage finished)."""
    d = PaperSettings(model=settings.model)
    parts = ["weightgraft paper", f"--model {settings.model}"]
    for flag, value, default in (("--world", settings.world, d.world), ("--relations", settings.relations, d.relations),
                                 ("--seed", settings.seed, d.seed), ("--train-seed", settings.train_seed, d.train_seed),
                                 ("--seeds", settings.seeds, d.seeds), ("--device", settings.device, d.device),
                                 ("--preset", settings.preset, d.preset), ("--max-steps", settings.max_steps, None),
                                 ("--batch-size", settings.batch_size, None), ("--margin", settings.margin, d.margin),
                                 ("--paper-model", settings.paper_model, None),
                                 ("--trajectory", settings.trajectory, None),
                                 ("--gentle-preset", settings.gentle_preset, None)):
        if value != default:
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    if settings.worlds:
        parts.append(f"--worlds {','.join(settings.worlds)}")
    if tuple(settings.sweeps) != (SWEEP_NAMES if settings.worlds else DEFAULT_SWEEPS):
        parts.append(f"--sweeps {','.join(settings.sweeps)}")
    if not settings.claims:
        parts.append("--no-claims")
    parts.append(f"--out {settings.out}")
    return " ".join(parts)


def report_rules(run: PaperRun) -> int:
    """The claims' rules version the report's rows were made with: its claims records' (the
    oldest, where a resumed run reused one judged under older rules), else the code's."""
    from weightgraft.localization.claims.regions import RULES_VERSION

    versions = [v for v in (rules_of(run.claims), rules_of(run.trajectory_claims)) if v is not None]
    return min(versions, default=RULES_VERSION)


def write_paper_report(run: PaperRun) -> Path:
    """``paper.md``, ``paper.html`` and each figure's PNG in the run's folder (a PNG already drawn
    from the same inputs, by its digest in ``paper-charts.json``, is kept); returns the markdown's
    path. ``paper.md`` is one generated block (``report.blocks``: its name, the claims' rules
    version and the command that makes it again), as docs/paper.md holds it."""
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
    atomic.write_text(path, wrap(block_name(run.settings), report_rules(run), paper_command(run.settings),
                                 to_markdown(blocks)))
    atomic.write_text(path.with_suffix(".html"), to_html(blocks, folder))
    return path


def side_by_side_part(text: str) -> str:
    """The report's text before its stage times (what a resumed run must give again)."""
    return text.split(f"## {TIMES_HEADING}")[0]
