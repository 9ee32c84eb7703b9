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
``pythia-2.8b``, or ``all`` for a figure whose panels the text does not name); ours is one
model, so one measured value stands beside the row of every paper model of its key.
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

STATED = "stated"
SHOWN = "shown, not stated"
NOT_RUN = "not run"
# sha256 of normalize_text(paper-full-text.txt): the text every quote was copied from
PAPER_TEXT_SHA256 = "9c131f00ae24b66e444ddaefd270bcd4fdf0bdd146da5f79673856c98e89977a"

MeasuredKey = tuple[str, str, str]  # (figure_id, scheme, metric)


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
    """``53`` and ``%`` -> ``53%``; another unit follows after a space; no unit, the value."""
    if not unit:
        return value
    return f"{value}{unit}" if unit == "%" else f"{value} {unit}"


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
    """One of our results: ``value`` and its interval ``[low, high]`` (None: no interval), in
    ``unit`` (``%`` for accuracies, as the paper writes them), shown with ``digits`` decimals."""

    value: float
    low: float | None = None
    high: float | None = None
    unit: str = "%"
    digits: int = 1

    def text(self) -> str:
        """``45.0% [30.0, 60.0]``; ``45.0%`` without an interval; ``n/a`` for a NaN value."""
        if not math.isfinite(self.value):
            return "n/a"
        shown = with_unit(f"{self.value:.{self.digits}f}", self.unit)
        if self.low is None or self.high is None or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return shown
        return f"{shown} [{self.low:.{self.digits}f}, {self.high:.{self.digits}f}]"


@dataclass(frozen=True)
class SideBySide:
    """One row of the report's table: the paper's number and ours."""

    id: str
    figure: str
    model: str
    scheme: str
    metric: str
    paper: str
    ours: str


def side_by_side(
    measured: Mapping[MeasuredKey, Measured],
    numbers: Sequence[PaperNumber] | None = None,
    *,
    figure_ids: Collection[str] | None = None,
) -> list[SideBySide]:
    """A row for each paper number (of ``figure_ids`` only, where given), in the table's order:
    the paper's value (or ``shown, not stated``) and ours from ``measured`` by the row's
    ``(figure_id, scheme, metric)`` (or ``not run``)."""
    rows = paper_numbers() if numbers is None else numbers
    out = []
    for n in rows:
        if figure_ids is not None and n.figure_id not in figure_ids:
            continue
        ours = measured.get(n.key)
        out.append(SideBySide(id=n.id, figure=n.figure, model=n.model, scheme=n.scheme, metric=n.metric,
                              paper=n.paper_text(), ours=NOT_RUN if ours is None else ours.text()))
    return out


def unmatched(measured: Iterable[MeasuredKey], numbers: Sequence[PaperNumber] | None = None) -> list[MeasuredKey]:
    """Our keys that no paper row has (a typo in a figure id or scheme, or a result the paper
    has no number for), sorted."""
    known = {n.key for n in (paper_numbers() if numbers is None else numbers)}
    return sorted(k for k in set(measured) if k not in known)


HEADER = ("figure or section", "model", "scheme", "metric", "the paper", "ours")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(rows: Iterable[SideBySide]) -> str:
    """The side-by-side rows as a markdown table (header included), ending in a newline."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = (r.figure, r.model, r.scheme, r.metric, r.paper, r.ours)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
