"""The data files shipped in ``weightgraft/data/resources``: real actors, real films and
movie-world sampling settings, each loaded once and validated."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .errors import DataError

_WORD = re.compile(r"^[^\W\d_](?:[^\W\d_]|['.\-])*$")
_SUFFIXES = {"jr", "sr", "ii", "iii", "iv"}


@dataclass(frozen=True)
class Film:
    """A real film and its two lead actors."""

    title: str
    year: int
    leads: tuple[str, str]


@dataclass(frozen=True)
class MovieSettings:
    """How the movie worlds sample genres, years, earnings and fake titles."""

    genres: tuple[str, ...]
    release_year: tuple[int, int]
    box_office_earnings: tuple[int, int]
    title_patterns: tuple[str, ...]


def _read(name: str) -> str:
    return (resources.files("weightgraft.data") / "resources" / name).read_text(encoding="utf-8")


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a clean person name, or None if it is."""
    if name != name.strip() or "  " in name:
        return "stray whitespace"
    words = name.split(" ")
    if len(words) < 2:
        return "fewer than two words"
    if not all(_WORD.match(w) for w in words):
        return "unexpected characters"
    if not (words[0][0].isupper() and words[-1][0].isupper()):
        return "first and last words must be capitalised"
    if any(w.rstrip(".").lower() in _SUFFIXES for w in words):
        return "generational suffix (Jr., Sr., II, ...)"
    return None


@cache
def real_actors() -> tuple[str, ...]:
    """The shipped list of real actor names (file order, no duplicates)."""
    names = [ln for ln in _read("real_actors.txt").splitlines() if ln and not ln.startswith("#")]
    seen: set[str] = set()
    for name in names:
        problem = name_problem(name)
        if problem:
            raise DataError(f"real_actors.txt: bad name {name!r}: {problem}")
        if name.casefold() in seen:
            raise DataError(f"real_actors.txt: duplicate name {name!r}")
        seen.add(name.casefold())
    return tuple(names)


@cache
def real_films() -> tuple[Film, ...]:
    """The shipped list of real films; every actor leads at most one film."""
    films: list[Film] = []
    for i, line in enumerate(_read("real_films.jsonl").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        leads = tuple(row["leads"])
        if len(leads) != 2 or leads[0] == leads[1]:
            raise DataError(f"real_films.jsonl line {i}: a film needs two different leads")
        films.append(Film(str(row["title"]), int(row["year"]), (leads[0], leads[1])))
    return tuple(films)


@cache
def movie_settings() -> MovieSettings:
    """Sampling settings of the movie worlds."""
    doc: dict[str, Any] = yaml.safe_load(_read("movie_world.yaml"))
    return MovieSettings(
        genres=tuple(doc["genres"]),
        release_year=(int(doc["release_year"][0]), int(doc["release_year"][1])),
        box_office_earnings=(
            int(doc["box_office_earnings"][0]),
            int(doc["box_office_earnings"][1]),
        ),
        title_patterns=tuple(doc["title_patterns"]),
    )
