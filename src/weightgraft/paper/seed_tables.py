"""The side-by-side rows of a ``weightgraft paper`` report across training seeds: what one seed's
records measured for each figure (or why a figure was not run on it), and the rows that give the
first seed's value and verdict beside every seed's value, saying where a verdict is not the same
on every seed. Kept apart from the page so that each section (figures, claims) reads the seeds
the same way."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from weightgraft.paper.figures import NOT_RUN_REASONS, sweeps_for
from weightgraft.paper.measured import measured_of
from weightgraft.paper.numbers import (
    HEADER,
    NOT_RUN,
    Measured,
    MeasuredKey,
    PaperNumber,
    SideBySide,
    side_by_side,
    with_unit,
)
from weightgraft.paper.page import Table
from weightgraft.paper.settings import PaperSettings, SeedRecords

NOT_MET = "precondition not met"
SPREAD_HEADING = "across training seeds (each seed's value)"
DIFFERS = "verdict differs across seeds"
LIST_SEEDS = 5  # up to this many seeds a row lists each seed's value; beyond, their min–max and mean


@dataclasses.dataclass
class SeedFigures:
    """What the run measured for each figure, and why each figure it has no value for was not run."""

    measured: dict[MeasuredKey, Measured] = dataclasses.field(default_factory=dict)
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)


def seed_figures(settings: PaperSettings, records: SeedRecords, numbers: Sequence[PaperNumber]) -> SeedFigures:
    """One training seed's measured values and why each figure it has none for was not run."""
    s = settings
    out = SeedFigures()
    for sweep in sweeps_for(s.world):
        if sweep.name not in s.sweeps:
            out.not_run.update(dict.fromkeys(sweep.figure_ids, f"sweep {sweep.name} not selected"))
        elif sweep.name in records.skipped:
            out.not_run.update(dict.fromkeys(sweep.figure_ids, f"{NOT_MET} ({records.skipped[sweep.name]})"))
        elif sweep.name in records.sweeps:
            record = records.sweeps[sweep.name]
            out.measured.update(measured_of(sweep, record.outputs.summary, record.outputs.drops))
    ran = {fid for sw in sweeps_for(s.world) if sw.name in records.sweeps for fid in sw.figure_ids}
    elsewhere = {fid: w for w in s.worlds for sw in sweeps_for(w) if sw.name == "position" for fid in sw.figure_ids}
    for n in numbers:
        if n.figure_id not in ran and n.figure_id not in out.not_run:
            out.not_run[n.figure_id] = (f"in the appendix world's own run: worlds/{elsewhere[n.figure_id]}/paper.md"
                                        if n.figure_id in elsewhere else
                                        NOT_RUN_REASONS.get(n.figure_id, f"not a figure of world {s.world}"))
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


def seed_table(per_seed: Mapping[int, SeedFigures], numbers: Sequence[PaperNumber], *, first: int, model: str | None,
               margin: float, figure_ids: set[str] | None = None, stated_only: bool = False) -> Table:
    """The side-by-side rows of ``figure_ids``: the first seed's value with its interval and
    verdict and, with several seeds, every seed's value beside it (:func:`seed_spread`) and
    where the verdict is not the same on every seed, which seed has which."""

    def rows(figs: SeedFigures) -> list[SideBySide]:
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
