"""The report of a ``weightgraft paper`` run: the numbers the paper states first, each beside ours
with its verdict (``numbers``: an equivalence test only on the paper's own model, the shape only
on any other, or why it was not run); the finetunes' preconditions (the control's the other way
round); each figure of the run drawn as the paper draws it, with every row of the paper beside
ours; the figures it did not run and why; the claims; the stage times. Written as ``paper.md``,
``paper.html`` and one PNG per figure beside them, from the stages' records only (the same
records give the same report). With several training seeds each row also gives every seed's value
and says where its verdict is not the same on every seed, and each claim its verdicts across
the seeds."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
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
    NOT_RUN,
    PaperNumber,
    SideBySide,
    paper_numbers,
    side_by_side,
    with_unit,
)
from weightgraft.paper.settings import PaperSettings, SeedRecords, precondition, seed_label, seeds_text
from weightgraft.report.html import CSS, html_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from weightgraft.paper.settings import PaperRun

TIMES_HEADING = "Stage times"
CHART_DIGESTS = "paper-charts.json"  # each PNG's digest (charts.chart_digest): one already drawn is kept
STATED_HEADING = "The numbers the paper states"
NOT_MET = "precondition not met"
SPREAD_HEADING = "across training seeds (each seed's value)"
DIFFERS = "verdict differs across seeds"
LIST_SEEDS = 5  # up to this many seeds a row lists each seed's value; beyond, their min–max and mean


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


def _figures(settings: PaperSettings, records: SeedRecords, numbers: Sequence[PaperNumber]) -> _Figures:
    """One training seed's measured values and why each figure it has none for was not run."""
    s = settings
    out = _Figures()
    for sweep in sweeps_for(s.world):
        if sweep.name not in s.sweeps:
            out.not_run.update(dict.fromkeys(sweep.figure_ids, f"sweep {sweep.name} not selected"))
        elif sweep.name in records.skipped:
            out.not_run.update(dict.fromkeys(sweep.figure_ids, f"{NOT_MET} ({records.skipped[sweep.name]})"))
        elif sweep.name in records.sweeps:
            record = records.sweeps[sweep.name]
            out.measured.update(measured_of(sweep, record["outputs"]["summary"], record["outputs"].get("drops")))
    ran = {fid for sw in sweeps_for(s.world) if sw.name in records.sweeps for fid in sw.figure_ids}
    for n in numbers:
        if n.figure_id not in ran and n.figure_id not in out.not_run:
            out.not_run[n.figure_id] = NOT_RUN_REASONS.get(n.figure_id, f"not a figure of world {s.world}")
    return out


def _value_text(m: Measured | None) -> str:
    """A value without its interval (a drop also relative): one seed's entry in the spread."""
    if m is None:
        return NOT_RUN
    if not math.isfinite(m.value):
        return "n/a"
    own = with_unit(f"{m.value:.{m.digits}f}", m.unit)
    rel = m.relative
    if rel is not None and math.isfinite(rel.value):
        own += f", {with_unit(f'{rel.value:.{rel.digits}f}', rel.unit)}"
    return own


def _stats(values: Sequence[Measured], part: Callable[[Measured], Measured | None]) -> tuple[str, str] | None:
    """The min–max and the mean of one part of ``values`` (the value, or a drop's relative
    reading), each with its unit; None where no value has that part."""
    parts = [m for m in map(part, values) if m is not None and math.isfinite(m.value)]
    if not parts:
        return None
    unit, digits, xs = parts[0].unit, parts[0].digits, [m.value for m in parts]

    def f(x: float) -> str:
        return with_unit(f"{x:.{digits}f}", unit)

    return f"{min(xs):.{digits}f}–{f(max(xs))}", f(sum(xs) / len(xs))


def seed_spread(values: Mapping[int, Measured | None]) -> str:
    """A row's values across training seeds: each seed's value where there are at most
    ``LIST_SEEDS`` seeds (``seed 0: 45.0%; seed 1: 50.0%; mean 47.5%``), else their min–max and
    mean (``40.0–55.0%, mean 47.5% over 7 of 7 seeds``); a seed without a value (not run, n/a)
    is named; nothing where no seed ran it."""
    if all(m is None for m in values.values()):
        return ""  # not run on any seed: the row's verdict says why
    ran = [m for m in values.values() if m is not None and math.isfinite(m.value)]
    stats = [x for x in (_stats(ran, lambda m: m), _stats(ran, lambda m: m.relative)) if x is not None]
    if len(values) <= LIST_SEEDS:
        of = f" ({len(ran)} seeds)" if len(ran) < len(values) else ""
        mean = [f"mean {', '.join(m for _, m in stats)}{of}"] if len(ran) > 1 else []
        return "; ".join([f"seed {seed}: {_value_text(m)}" for seed, m in values.items()] + mean)
    missing = [seed for seed, m in values.items() if m is None or not math.isfinite(m.value)]
    text = "; ".join(f"{span}, mean {mean}" for span, mean in stats) or "no value on any seed"
    return f"{text} over {len(ran)} of {len(values)} seeds" + \
        (f" (no value on seed{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))})" if missing else "")


def _verdict_kind(verdict: str) -> str:
    """A verdict without the numbers of its reason (each seed's ``not run`` names its own)."""
    return verdict.split(" (")[0] if verdict.startswith(NOT_RUN) else verdict


def seed_verdicts(verdicts: Mapping[int, str]) -> str:
    """``verdict differs across seeds: seed 0: X / seeds 1, 2: Y`` where the seeds' verdicts
    are not all the same (seeds of the same verdict together; `` / `` between them, as a verdict
    may hold ``;``), else ``""``."""
    groups: dict[str, list[int]] = {}
    for seed, v in verdicts.items():
        groups.setdefault(_verdict_kind(v), []).append(seed)
    if len(groups) <= 1:
        return ""
    return f"{DIFFERS}: " + " / ".join(f"seed{'s' if len(on) > 1 else ''} {', '.join(map(str, on))}: {v}"
                                       for v, on in groups.items())


def seed_table(per_seed: Mapping[int, _Figures], numbers: Sequence[PaperNumber], *, first: int, model: str | None,
               margin: float, figure_ids: set[str] | None = None, stated_only: bool = False) -> Table:
    """The side-by-side rows of ``figure_ids``: the first seed's value with its interval and
    verdict and, with several seeds, every seed's value beside it (:func:`seed_spread`) and
    where the verdict is not the same on every seed, which seed has which."""

    def rows(figs: _Figures) -> list[SideBySide]:
        out = side_by_side(figs.measured, numbers, figure_ids=figure_ids, model=model, margin=margin,
                           not_run=figs.not_run)
        return [r for r in out if r.stated] if stated_only else out

    own = rows(per_seed[first])
    if len(per_seed) == 1:
        return Table(HEADER, [r.cells() for r in own])
    verdicts = {seed: {(r.figure_id, r.scheme, r.metric): r.verdict for r in rows(figs)}
                for seed, figs in per_seed.items()}
    header = (*HEADER[:6], SPREAD_HEADING, *HEADER[6:])
    table = []
    for r in own:
        key = (r.figure_id, r.scheme, r.metric)
        cells = list(r.cells())
        differs = seed_verdicts({seed: v[key] for seed, v in verdicts.items()})
        cells[7] += f"; {differs}" if differs else ""
        spread = seed_spread({seed: figs.measured.get(key) for seed, figs in per_seed.items()})
        table.append((*cells[:6], spread, *cells[6:]))
    return Table(header, table)


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
        ("p", f"Nief et al., \"Multiple Streams of Knowledge Retrieval\": each number the paper states (or a bar it "
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
    per_seed = {seed: _figures(s, records, numbers) for seed, records in seeds.items()}
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
        summary = seeds[drawn].sweeps[sweep.name]["outputs"]["summary"]
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
    blocks += claims_blocks(run)
    blocks.append(("h2", TIMES_HEADING))
    times = [("data", s.world, run.data["key"][:12], f"{run.data['seconds']:.1f}", _reused(run, "data"))]
    if run.shuffled_data is not None:
        times.append(("data", run.shuffled_data["name"], run.shuffled_data["key"][:12],
                      f"{run.shuffled_data['seconds']:.1f}", _reused(run, "data shuffled")))
    for seed, records in seeds.items():
        label = seed_label(s, seed)
        times += [(f"finetune {n}{label}", FINETUNES[n].split, r["key"][:12], f"{r['seconds']:.1f}",
                   _reused(run, f"finetune {n}{label}")) for n, r in records.finetunes.items()]
    for seed, records in seeds.items():
        label = seed_label(s, seed)
        times += [(f"sweep {n}{label}", "", r["key"][:12], f"{r['seconds']:.1f}", _reused(run, f"sweep {n}{label}"))
                  for n, r in records.sweeps.items()]
    if run.claims is not None:
        times.append(("claims", "", run.claims["key"][:12], f"{run.claims['seconds']:.1f}", _reused(run, "claims")))
    blocks.append(Table(("stage", "what", "key", "seconds (when it ran)", "this run"), times))
    return blocks


def _top5_text(r: dict[str, Any]) -> str:
    return _pct(r["top5"]) + (f" [{100 * r['top5_lo']:.1f}, {100 * r['top5_hi']:.1f}]"
                              if r["top5_lo"] is not None and r["top5_hi"] is not None else "")


def _extra_table(run: PaperRun, name: str) -> Table:
    """A sweep the paper states no number for: top-5 per scheme, the first seed it ran on with
    its interval and, with several seeds, each seed's."""
    seeds = run.by_seed()
    ran = {seed: {(r["template"], r["direction"], r["scheme"]): r for r in records.sweeps[name]["outputs"]["summary"]}
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
    said = ("; the paper's stated values marked" if any(n.metric != DROP for n in marks) else "") + \
           ("; its stated drop named in the legend" if any(n.metric == DROP for n in marks) else "")
    what = "mean target rank per scheme" if fig.metric != "top-5 accuracy" else \
        "top-5 accuracy per scheme with its 95% interval"
    finetuned = "" if seed is None else f" (the finetunes of training seed {seed})"
    return Image(f"paper-{fig.figure_id}.png", f"{fig.label}: {what} on {model}{finetuned}{said}.",
                 chart_digest(fig, summary, numbers, model), lambda: figure_chart(fig, summary, numbers, model))


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
            rows.append((name, *([str(seed)] if several else []), split, "met" if ok else NOT_MET,
                         line.partition(": ")[2]))
            if finetune.shuffled and not ok:
                on = f" of training seed {seed}" if several else ""
                flags.append(("p", f"Flag: the control finetune{on} knows the facts ({line.partition(': ')[2]}). Its "
                                   "precondition is a low trained-direction top-5 (it was taught each answer of "
                                   "another subject); the claims' control test then compares the a2b finetune with a "
                                   "donor that names the true answer."))
    mixed: list[Block] = [("p", f"{name}: precondition met on {seeds_text(by[True])}, not met on {seeds_text(by[False])}.")
                          for name, by in met.items() if by[True] and by[False]]
    header = ("finetune", *(["training seed"] if several else []), "split", "precondition",
              "top-5 on its test prompts (the world's true answers)")
    return [("h2", "Finetunes and their preconditions"), Table(header, rows), *mixed, *flags]


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


def _claims_seed(run: PaperRun) -> int:
    """The training seed whose both-directions and control finetunes the claims used (the first
    seed judged)."""
    judged = (run.claims or {}).get("outputs", {}).get("sft_seeds")
    return judged[0] if judged else run.settings.train_seed


def _control_note(run: PaperRun) -> list[Block]:
    seed = _claims_seed(run)
    record = run.by_seed().get(seed, run.by_seed()[run.settings.train_seed]).finetunes.get("control")
    if record is None:
        return [("p", "No control finetune in this run: the fact claims are judged against their nulls only.")]
    s = run.settings
    ok, line = precondition(s, FINETUNES["control"], record)
    said = (f"at most {100 * s.control_top5:.0f}%, its precondition" if ok else
            f"above {100 * s.control_top5:.0f}%: flagged above, the control knows facts it was not taught")
    which = "" if s.seeds == 1 else (f" The claims use one control finetune (localize takes one), training seed "
                                     f"{seed}'s, for the a2b finetune of every seed.")
    return [("p", f"The control finetune was used (`models.control`): the a2b finetune's recipe (split a2b, preset "
                  f"{s.preset}, training seed {seed}, the same training templates) on the same world and seed "
                  "with each answer moved to another subject. Each fact claim of the a2b finetune "
                  f"({'`sft`' if s.seeds == 1 else 'each `sft[i]`'}) is tested "
                  "against the same region grafted from it, prompt by prompt (`control p`; its rows are the "
                  "`control` donor's, `null finetune`). Its own trained-direction top-5 on the world's true facts: "
                  f"{line.partition(': ')[2]} ({said}).{which}")]


def _donor(model: str, sft_seeds: Sequence[int] | None) -> str:
    """``sft[1] (training seed 1)`` where the claims ran on several seeds' a2b finetunes."""
    found = re.fullmatch(r"sft\[(\d+)\]", model)
    if sft_seeds is None or found is None or int(found.group(1)) >= len(sft_seeds):
        return model
    return f"{model} (training seed {sft_seeds[int(found.group(1))]})"


def claims_across_seeds(run: PaperRun) -> list[Block]:
    """With several training seeds, each claim of the a2b finetune (``sft[i]``, one per seed
    judged) with its verdicts across the seeds (``holds on 3 of 3 seeds``), and the seeds not
    judged (their a2b finetune misses its precondition); nothing for one seed."""
    if run.claims is None or run.settings.seeds == 1:
        return []
    from weightgraft.paper.claims import judged_seeds

    judged: list[int] = run.claims["outputs"].get("sft_seeds") or []
    if not judged:
        return []
    _, missed = judged_seeds(run.settings, run)
    groups: dict[tuple[str, str, str, str], dict[int, dict[str, Any]]] = {}
    for r in run.claims["outputs"]["claims"]:
        found = re.fullmatch(r"sft\[(\d+)\]", str(r.get("model")))
        if found is None or int(found.group(1)) >= len(judged):
            continue
        key = (str(r.get("claim")), str(r.get("statement", "")), str(r.get("setting")), str(r.get("template")))
        groups.setdefault(key, {})[judged[int(found.group(1))]] = r
    rows = []
    for key, by_seed in groups.items():
        verdicts: dict[str, list[int]] = {}
        for seed, r in by_seed.items():
            verdicts.setdefault(str(r.get("verdict")), []).append(seed)
        parts = [f"{v} on {len(on)} of {len(judged)} seed{'s' if len(judged) > 1 else ''}"
                 + (f" ({seeds_text(on)})" if len(on) < len(judged) else "")
                 for v, on in verdicts.items()]
        differs = f"; {DIFFERS}" if len(verdicts) > 1 else ""
        exploratory = [seed for seed, r in by_seed.items() if r.get("evidence") == "exploratory"]
        evidence = ("exploratory on every seed" if len(exploratory) == len(by_seed) else
                    f"exploratory on {seeds_text(exploratory)}" if exploratory else "judged")
        rows.append((*key, "; ".join(parts) + differs, evidence))
    blocks: list[Block] = [("h3", "Each claim across training seeds"),
                           ("p", f"The a2b finetune of each of {seeds_text(judged)} is one donor of the claims' "
                                 "`models.sft` (`sft[i]`), each judged on its own; the both-directions setting "
                                 f"(`both->a2b`) and the control are training seed {_claims_seed(run)}'s only. "
                                 "Holm's adjustment runs over every row of the run, every seed's included."
                                 + ("" if not missed else
                                    f" Not judged on {seeds_text(list(missed))}: {NOT_MET} ("
                                    + "; ".join(f"training seed {seed}: {line}" for seed, line in missed.items())
                                    + ")."))]
    blocks.append(Table(("claim", "statement", "setting", "template", "verdicts across seeds", "evidence"), rows))
    return blocks


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
    blocks += claims_across_seeds(run)
    sft_seeds = run.claims["outputs"].get("sft_seeds")
    rows = []
    for r in run.claims["outputs"]["claims"]:
        holm_floor, floor = _floors(r)
        rows.append((str(r.get("claim")), str(r.get("statement", "")), _donor(str(r.get("model")), sft_seeds),
                     str(r.get("setting")),
                     "yes" if r.get("in_paper_setting") else "no", str(r.get("template")),
                     f"{r['n_prompts']:.0f}" if r.get("n_prompts") is not None else "",
                     f"{r.get('side', '')} {r['threshold']:g}" if r.get("threshold") is not None else "",
                     _share(r), _p(r, "p_holm", holm_floor),
                     _p(r, "control_p", floor) if r.get("control_p") is not None else "",
                     str(r.get("verdict")) + (" (exploratory)" if r.get("evidence") == "exploratory" else ""),
                     str(r.get("reason") or "")))
    if sft_seeds:
        blocks.append(("h3", "Every row"))
    blocks.append(Table(("claim", "statement", "donor", "setting", "paper's setting", "template", "prompts",
                         "threshold", "share [95% CI]", "p (Holm)", "control p", "verdict", "why"), rows))
    return blocks


def _reused(run: PaperRun, name: str) -> str:
    return "reused" if name in run.reused else "ran"


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
