"""What the short names inside the presets' scheme names mean (``FE``, ``LT``, ``^C``, ``+``,
...), so a report can define the names a run used without a list of its own. A new preset that
writes a new abbreviation into its names adds it here; ``tests/report/test_report_first_screen.py``
checks that every preset's names are covered."""

from __future__ import annotations

import re
from collections.abc import Iterable

# abbreviation -> meaning, in the order a legend lists them (models, positions, components,
# then the operators that join them)
ABBREVIATIONS: dict[str, str] = {
    "PRE": "pretrained model",
    "SFT": "finetuned model",
    "TASK": "task model",
    "RELATION": "relation model",
    "ONE": "model finetuned on one direction",
    "BOTH": "model finetuned on both directions",
    "FE": "first entity",
    "LT": "last token",
    "MOVIE": "movie title",
    "REL": "relation",
    "PREP": "preposition",
    "ATTN": "attention q, k, v",
    "O": "attention output",
    "FFN": "MLP gate, up, down",
    "FFN-UP": "MLP up",
    "FFN-DOWN": "MLP down",
    "ALL": "every component of a block",
    "^C": "complement (every other position)",
    "+": "union",
    "@": "at (the layers or positions after it)",
}

# an upper-case word not glued to other letters (``O`` in ``O+FFN``, not in ``Output``),
# ``^C``, or a joining operator
_TOKEN = re.compile(r"\^C|(?<![A-Za-z])[A-Z][A-Z0-9]*(?:-[A-Z]+)*(?![A-Za-z])|[+@]")


def abbreviations_in(name: str) -> list[str]:
    """The candidate abbreviations a scheme name is written with, in reading order."""
    return _TOKEN.findall(name)


def legend(scheme_names: Iterable[str]) -> list[tuple[str, str]]:
    """(abbreviation, meaning) of every known abbreviation in ``scheme_names``, in the table's
    order; names written without one (a user's ``my-scheme``) add nothing."""
    used = {token for name in scheme_names for token in abbreviations_in(str(name))}
    return [(abbr, meaning) for abbr, meaning in ABBREVIATIONS.items() if abbr in used]
