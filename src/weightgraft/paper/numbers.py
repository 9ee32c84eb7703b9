"""The paper's numbers (``numbers.csv``) and the side-by-side rows that set ours beside them.

Each row of ``numbers.csv`` is one number of the paper's experiments:

- ``status`` ``stated``: the paper writes the value; ``value`` is its text exactly as written
  (``53``, ``0.002``), ``unit`` its unit (``%``; empty for a probability or a rank), ``quote``
  the shortest verbatim snippet of the paper that holds it;
- ``status`` ``shown, not stated``: a bar of a figure whose value the paper does not write;
  ``value`` is empty and ``quote`` is the figure's caption.

``figure`` is where the paper puts the number, as it names it (``Fig. 2``, ``Sec. 4.1``);
``figure_id`` the experiment it belongs to (``fig2``, ``fig3a``, ``fig13b``, ``c7.1``), which is
what our measured results are keyed by, with ``scheme`` (our scheme names, the authors'
protocol: ``LT``, ``o_ffn@fourth_quarter``, ``FE:ATTN``; a difference of two schemes is
``A vs B``) and ``metric`` (``top-5 accuracy``, ``mean target token rank``, ``drop in top-5
accuracy``). ``where`` gives the section and the line of the paper's text file; ``note`` says
what the row assumes where the paper does not say (which test sentence, which bars).

The paper has four models (``model``: ``gemma-1.1-2b-it``, ``gpt2-xl``, ``Llama-3.2-1B``,
``pythia-2.8b``, or ``all`` for a figure whose panels the text does not name); a run has one
model, so the side-by-side table has one row per ``(figure_id, scheme, metric)``: our one
measured value, and the paper's models named in its cell.

Each row's verdict compares levels only where they can be compared:

- ``same model: equivalent`` / ``same model: not equivalent`` where the run's model is the
  paper's model of a stated number: a TOST at 5% a side with the equivalence margin fixed before
  the run, i.e. equivalent iff our 90% interval (Clopper-Pearson for a rate; for a drop, the
  paired interval in points and the log-ratio interval relative) lies within the number +-
  the margin;
- ``other model: shape only`` for a stated number of any other model: its level is not compared;
- ``no number stated: shape only`` for a bar the paper shows without its value;
- ``not run: why``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources

from weightgraft.paper.figures import DROP, RANK, TOP5

STATED = "stated"
SHOWN = "shown, not stated"
NOT_RUN = "not run"
# sha256 of normalize_text(paper-full-text.txt): the text every quote was copied from
PAPER_TEXT_SHA256 = "9c131f00ae24b66e444ddaefd270bcd4fdf0bdd146da5f79673856c98e89977a"

MeasuredKey = tuple[str, str, str]  # (figure_id, scheme, metric)
PAPER_MODELS = ("gemma-1.1-2b-it", "gpt2-xl", "Llama-3.2-1B", "pythia-2.8b")
# The paper's names of its models (its Table 2) beside the ids of the authors' code, which the rows use.
PAPER_NAMES = {"gemma-1.1-2b-it": "Gemma 2B", "gpt2-xl": "GPT-2 XL", "Llama-3.2-1B": "LLaMA 3.2 1B",
               "pythia-2.8b": "Pythia 2.8B"}
EQUIVALENCE_LEVEL = 0.90  # the interval of a TOST at 5% a side
SAME_EQUIVALENT = "same model: equivalent"
SAME_NOT_EQUIVALENT = "same model: not equivalent"
OTHER_MODEL = "other model: shape only"
NO_NUMBER = "no number stated: shape only"
# each metric's unit as the table's cells write it
METRIC_UNITS = {TOP5: "% of prompts", RANK: "rank, 0 = the top token", DROP: "points, and % relative"}


def normalize_text(text: str) -> str:
    """``text`` with every run of whitespace one space, stripped: how quotes are matched."""
    return " ".join(text.split())


def paper_text_sha256(text: str) -> str:
    """The sha256 (hex) of the paper's text, normalized (:func:`normalize_text`)."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PaperNumber:
    """One row of ``numbers.csv`` (see the module's docstring for each column)."""

    id: str
    figure: str
    figure_id: str
    model: str
    dataset: str
    sentence: str
    scheme: str
    metric: str
    value: str
    unit: str
    status: str
    quote: str
    where: str
    note: str

    @property
    def stated(self) -> bool:
        return self.status == STATED

    @property
    def number(self) -> float | None:
        """The stated value as a float; None where the paper shows it without stating it."""
        return float(self.value) if self.stated else None

    @property
    def key(self) -> MeasuredKey:
        """What our measured results are looked up by."""
        return (self.figure_id, self.scheme, self.metric)

    def paper_text(self) -> str:
        """The paper's cell: ``53%``, ``0.002``, or ``shown, not stated``."""
        return with_unit(self.value, self.unit) if self.stated else SHOWN


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(PaperNumber))


def with_unit(value: str, unit: str) -> str:
    """``53`` and ``%`` -> ``53%`` (``% relative`` -> ``53% relative``); another unit follows
    after a space; no unit, the value."""
    if not unit:
        return value
    return f"{value}{unit}" if unit.startswith("%") else f"{value} {unit}"


def read_numbers(text: str) -> list[PaperNumber]:
    """Parse a ``numbers.csv`` text, checking its columns, statuses, values and ids."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"numbers.csv columns {reader.fieldnames} are not {list(COLUMNS)}")
    rows: list[PaperNumber] = []
    seen: set[str] = set()
    for line, raw in enumerate(reader, start=2):
        row = PaperNumber(**{c: (raw[c] or "").strip() for c in COLUMNS})
        where = f"numbers.csv line {line} ({row.id or 'no id'})"
        if not row.id or row.id in seen:
            raise ValueError(f"{where}: every row needs an id of its own")
        seen.add(row.id)
        if row.status == STATED:
            try:
                ok = math.isfinite(float(row.value))
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{where}: a stated row needs its number, got {row.value!r}")
        elif row.status == SHOWN:
            if row.value:
                raise ValueError(f"{where}: a row shown, not stated has no value, got {row.value!r}")
        else:
            raise ValueError(f"{where}: status {row.status!r} is neither {STATED!r} nor {SHOWN!r}")
        if not row.quote:
            raise ValueError(f"{where}: every row quotes the paper")
        rows.append(row)
    return rows


@lru_cache(maxsize=1)
def _shipped() -> tuple[PaperNumber, ...]:
    text = (resources.files("weightgraft.paper") / "numbers.csv").read_text(encoding="utf-8")
    return tuple(read_numbers(text))


def paper_numbers() -> list[PaperNumber]:
    """Every row of the shipped ``numbers.csv``, in its order."""
    return list(_shipped())


@dataclass(frozen=True)
class Measured:
    """One of our results: ``value`` and its 95% interval ``[low, high]`` (None: no interval), in
    ``unit`` (``%`` for accuracies, as the paper writes them; ``points`` for a drop), shown with
    ``digits`` decimals; ``n`` the prompts it is measured on; ``[low90, high90]`` the 90%
    interval the equivalence test reads; ``relative``: a drop read relative to the level it drops
    from (the paper's "29%" may be either)."""

    value: float
    low: float | None = None
    high: float | None = None
    unit: str = "%"
    digits: int = 1
    n: int | None = None
    low90: float | None = None
    high90: float | None = None
    relative: Measured | None = None

    def text(self) -> str:
        """``45.0% [30.0, 60.0]``; ``45.0%`` without an interval; ``n/a`` for a NaN value; a drop
        ``12.5 points [2.1, 22.9]; 25.0% relative [5.0, 41.0]``."""
        own = self._own_text()
        return own if self.relative is None else f"{own}; {self.relative._own_text()}"

    def _own_text(self) -> str:
        if not math.isfinite(self.value):
            unit = self.unit.strip("% ")
            return f"n/a ({unit})" if unit else "n/a"
        shown = with_unit(f"{self.value:.{self.digits}f}", self.unit)
        if self.low is None or self.high is None or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return shown
        return f"{shown} [{self.low:.{self.digits}f}, {self.high:.{self.digits}f}]"


def equivalent(stated: float, low90: float, high90: float, margin: float) -> bool:
    """TOST at 5% a side: our 90% interval lies within ``stated`` +- ``margin``."""
    return stated - margin <= low90 and high90 <= stated + margin


def level_verdict(stated: float, ours: Measured, margin: float) -> str:
    """The verdict of a stated number on the paper's own model; a drop is tested in points and
    relative, since the paper does not say which it means."""

    def one(m: Measured) -> bool | None:
        if m.low90 is None or m.high90 is None or not (math.isfinite(m.low90) and math.isfinite(m.high90)):
            return None
        return equivalent(stated, m.low90, m.high90, margin)

    def word(ok: bool | None) -> str:
        return "no interval to test" if ok is None else "equivalent" if ok else "not equivalent"

    if ours.relative is None:
        ok = one(ours)
        return f"same model: {word(ok)}"
    return f"same model: {word(one(ours))} in points, {word(one(ours.relative))} relative"


@dataclass(frozen=True)
class SideBySide:
    """One row of the report's table: one key ``(figure_id, scheme, metric)``, the paper's
    numbers of every model for it, our one measured value and its verdict."""

    figure_id: str
    figure: str
    sentence: str
    scheme: str
    metric: str
    paper: str
    ours: str
    prompts: str
    verdict: str
    assumes: str
    stated: bool
    ids: tuple[str, ...]

    def cells(self) -> tuple[str, ...]:
        return (self.figure, self.sentence, self.scheme, metric_text(self.metric), self.paper, self.ours,
                self.prompts, self.verdict, self.assumes)


HEADER = ("figure or section", "sentence", "scheme", "metric (unit)", "the paper (its models)",
          "ours [95% interval], in the metric's unit", "prompts", "verdict", "the row assumes")


def metric_text(metric: str) -> str:
    """``top-5 accuracy (% of prompts)``: the metric with its unit."""
    unit = METRIC_UNITS.get(metric, "probability" if metric.startswith("target token probability") else "")
    return f"{metric} ({unit})" if unit else metric


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _paper_cell(group: Sequence[PaperNumber]) -> str:
    stated = [f"{n.paper_text()} ({n.model})" for n in group if n.stated]
    shown = _unique(n.model for n in group if not n.stated)
    if shown:
        stated.append(f"{SHOWN} ({', '.join('all panels' if m == 'all' else m for m in shown)})")
    return "; ".join(stated)


def _verdict(group: Sequence[PaperNumber], ours: Measured | None, model: str | None, margin: float,
             why: str) -> str:
    if ours is None:
        return f"{NOT_RUN}: {why}"
    stated = [n for n in group if n.stated]
    if not stated:
        return NO_NUMBER
    parts = [(n.model, level_verdict(n.number, ours, margin) if n.model == model and n.number is not None
              else OTHER_MODEL) for n in stated]
    verdicts = _unique(v for _, v in parts)
    if len(parts) == 1 or verdicts == [OTHER_MODEL]:
        return verdicts[0]
    return "; ".join(f"{m}: {v}" for m, v in parts)


def side_by_side(
    measured: Mapping[MeasuredKey, Measured],
    numbers: Sequence[PaperNumber] | None = None,
    *,
    figure_ids: Collection[str] | None = None,
    model: str | None = None,
    margin: float = 10.0,
    not_run: Mapping[str, str] | None = None,
) -> list[SideBySide]:
    """One row per key of the paper's rows (of ``figure_ids`` only, where given), the keys with a
    stated number first, else in the table's order: the paper's numbers with their models, ours
    from ``measured`` and the verdict. ``model``: the paper's model the run's model is (None:
    none of them); ``margin``: the equivalence margin (points); ``not_run``: figure_id -> why a
    key without a measured value was not run."""
    rows = paper_numbers() if numbers is None else numbers
    groups: dict[MeasuredKey, list[PaperNumber]] = {}
    for n in rows:
        if figure_ids is None or n.figure_id in figure_ids:
            groups.setdefault(n.key, []).append(n)
    out = []
    for key, group in groups.items():
        group = sorted(group, key=lambda n: not n.stated)
        ours = measured.get(key)
        why = (not_run or {}).get(key[0], "no such row in the run's results")
        out.append(SideBySide(
            figure_id=key[0], figure="; ".join(_unique(n.figure for n in group)),
            sentence="; ".join(_unique(n.sentence for n in group)), scheme=key[1], metric=key[2],
            paper=_paper_cell(group), ours=NOT_RUN if ours is None else ours.text(),
            prompts="" if ours is None or ours.n is None else str(ours.n),
            verdict=_verdict(group, ours, model, margin, why),
            assumes=" / ".join(_unique(n.note for n in group)), stated=any(n.stated for n in group),
            ids=tuple(n.id for n in group)))
    return sorted(out, key=lambda r: not r.stated)


def unmatched(measured: Iterable[MeasuredKey], numbers: Sequence[PaperNumber] | None = None) -> list[MeasuredKey]:
    """Our keys that no paper row has (a typo in a figure id or scheme, or a result the paper
    has no number for), sorted."""
    known = {n.key for n in (paper_numbers() if numbers is None else numbers)}
    return sorted(k for k in set(measured) if k not in known)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(rows: Iterable[SideBySide]) -> str:
    """The side-by-side rows as a markdown table (header included), ending in a newline."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(c) for c in r.cells()) + " |")
    return "\n".join(lines) + "\n"
