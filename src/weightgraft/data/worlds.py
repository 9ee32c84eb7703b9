"""The paper's three movie worlds: seeded generators of relation metadata.

Each generator returns ``n`` records with the fields ``first_actor, second_actor,
movie_title, main_character, release_year, genre, city, box_office_earnings`` (the builder
adds ``id`` and ``group``). In every world all actor names are distinct across relations,
so "X starred in a movie with" has exactly one answer in either direction.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .errors import (
    AmbiguousPromptError,
    DataError,
    NotEnoughDataError,
    UnknownWorldError,
)
from .resources import Film, movie_settings, real_actors, real_films
from .sampling import FakeSource, derangement, derive_rng

MOVIE_FIELDS = (
    "first_actor",
    "second_actor",
    "movie_title",
    "main_character",
    "release_year",
    "genre",
    "city",
    "box_office_earnings",
)

Generator = Callable[[int, int], list[dict]]


@dataclass(frozen=True)
class World:
    """A built-in world: its generator, its template set and its size limit (None: no fixed one)."""

    name: str
    description: str
    templates: str
    generate: Generator
    max_n: Callable[[], int | None]


def _movie_records(
    pairs: Sequence[tuple[str, str]],
    titles: Sequence[str],
    years: Sequence[int] | None,
    fakes: FakeSource,
    rng: random.Random,
) -> list[dict]:
    """Complete actor pairs and titles with sampled years, genres, cities and earnings."""
    s = movie_settings()
    n = len(pairs)
    cities = fakes.cities(n)
    characters = fakes.person_names(n)
    records = []
    for i, (first, second) in enumerate(pairs):
        year = years[i] if years is not None else rng.randint(*s.release_year)
        records.append(
            {
                "first_actor": first,
                "second_actor": second,
                "movie_title": titles[i],
                "main_character": characters[i],
                "release_year": year,
                "genre": rng.choice(s.genres),
                "city": cities[i],
                "box_office_earnings": rng.randint(*s.box_office_earnings),
            }
        )
    return records


def _real_pairs() -> set[frozenset[str]]:
    return {frozenset(f.leads) for f in real_films()}


def _avoid_pairs(
    pairs: list[tuple[str, str]], forbidden: set[frozenset[str]]
) -> list[tuple[str, str]]:
    """Reassign second actors so that no pair is in ``forbidden`` (real co-stars)."""
    pairs = [tuple(p) for p in pairs]
    for _ in range(100):
        bad = [i for i, p in enumerate(pairs) if frozenset(p) in forbidden]
        if not bad:
            return pairs  # type: ignore[return-value]
        if len(pairs) < 2:
            break
        for i in bad:
            j = (i + 1) % len(pairs)
            (a, b), (c, d) = pairs[i], pairs[j]
            pairs[i], pairs[j] = (a, d), (c, b)
    raise DataError("could not pair actors without repeating a real co-star pair")


def _title_exclusions() -> set[str]:
    return {f.title for f in real_films()}


def fake_movies_real_actors(n: int, seed: int) -> list[dict]:
    """Pairs of real actors (never real co-stars) in Faker-titled fake movies."""
    actors = real_actors()
    if 2 * n > len(actors):
        raise NotEnoughDataError(
            f"world 'fake_movies_real_actors' has {len(actors)} real actors, enough for at most "
            f"{len(actors) // 2} relations; {n} were requested"
        )
    rng = derive_rng(seed, "fake_movies_real_actors")
    chosen = rng.sample(actors, 2 * n)
    pairs = _avoid_pairs([(chosen[2 * i], chosen[2 * i + 1]) for i in range(n)], _real_pairs())
    fakes = FakeSource(seed, exclude=[*actors, *_title_exclusions()])
    titles = fakes.titles(n, movie_settings().title_patterns)
    return _movie_records(pairs, titles, None, fakes, rng)


def fake_movies_fake_actors(n: int, seed: int) -> list[dict]:
    """Faker-named actors in Faker-titled fake movies."""
    rng = derive_rng(seed, "fake_movies_fake_actors")
    fakes = FakeSource(seed, exclude=[*real_actors(), *_title_exclusions()])
    names = fakes.person_names(2 * n)
    titles = fakes.titles(n, movie_settings().title_patterns)
    pairs = [(names[2 * i], names[2 * i + 1]) for i in range(n)]
    return _movie_records(pairs, titles, None, fakes, rng)


def _shuffled_leads(n: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """Two derangements that differ at every position: film i gets the first lead of film
    ``p[i]`` and the second lead of film ``q[i]`` (never its own leads, never a real pair)."""
    p = derangement(n, rng)
    for _ in range(1000):
        q = derangement(n, rng)
        if all(a != b for a, b in zip(p, q, strict=True)):
            return p, q
    raise DataError(f"could not reassign the leads of {n} films")


def real_movies_real_actors_shuffled(n: int, seed: int) -> list[dict]:
    """Real films whose real lead pairs are moved to other films (paper, §4 "Data"), as in the
    authors' released data: every pair of actors is a real co-star pair and keeps its order;
    only the film is new (a seeded derangement, so no film keeps its own pair)."""
    films = real_films()
    if n > len(films):
        raise NotEnoughDataError(
            f"world 'real_movies_real_actors_shuffled' has {len(films)} real films; "
            f"{n} relations were requested"
        )
    if n < 2:
        raise NotEnoughDataError(
            "world 'real_movies_real_actors_shuffled' needs n >= 2 to move pairs between films"
        )
    rng = derive_rng(seed, "real_movies_real_actors_shuffled/pairs")
    chosen: list[Film] = rng.sample(films, n)
    p = derangement(n, rng)
    pairs = [(chosen[p[i]].leads[0], chosen[p[i]].leads[1]) for i in range(n)]
    fakes = FakeSource(seed, exclude=[*real_actors(), *_title_exclusions()])
    return _movie_records(
        pairs, [f.title for f in chosen], [f.year for f in chosen], fakes, rng
    )


def real_movies_real_actors_repaired(n: int, seed: int) -> list[dict]:
    """Real films starring the leads of other real films, re-paired (weightgraft's variant of
    the paper's shuffled world).

    Every selected film keeps its title and release year, gets the first lead of one other
    selected film and the second lead of a third one: no film keeps its own pair or any of
    its own leads, and no pair of actors is a real lead pair, so both the actor-actor and
    the actor-film facts are new (they overwrite existing knowledge).
    """
    films = real_films()
    if n > len(films):
        raise NotEnoughDataError(
            f"world 'real_movies_real_actors_repaired' has {len(films)} real films; "
            f"{n} relations were requested"
        )
    if n < 3:
        raise NotEnoughDataError(
            "world 'real_movies_real_actors_repaired' needs n >= 3 to re-pair the leads of "
            "different films"
        )
    rng = derive_rng(seed, "real_movies_real_actors_shuffled")
    chosen: list[Film] = rng.sample(films, n)
    p, q = _shuffled_leads(n, rng)
    pairs = [(chosen[p[i]].leads[0], chosen[q[i]].leads[1]) for i in range(n)]
    real = _real_pairs()
    # Guaranteed by construction and by the data rule "each actor leads one film"; checked anyway.
    for film, pair in zip(chosen, pairs, strict=True):
        if set(pair) & set(film.leads) or frozenset(pair) in real:
            raise DataError(f"film {film.title!r} would keep a lead or get a real lead pair")
    fakes = FakeSource(seed, exclude=[*real_actors(), *_title_exclusions()])
    return _movie_records(
        pairs, [f.title for f in chosen], [f.year for f in chosen], fakes, rng
    )


WORLDS: dict[str, World] = {
    w.name: w
    for w in (
        World(
            "fake_movies_real_actors",
            "real actors paired in fake movies (the paper's main dataset)",
            "movies",
            fake_movies_real_actors,
            lambda: len(real_actors()) // 2,
        ),
        World(
            "fake_movies_fake_actors",
            "fake actors in fake movies",
            "movies",
            fake_movies_fake_actors,
            lambda: None,
        ),
        World(
            "real_movies_real_actors_shuffled",
            "real co-star pairs moved to other real films (the authors' shuffle)",
            "movies",
            real_movies_real_actors_shuffled,
            lambda: len(real_films()),
        ),
        World(
            "real_movies_real_actors_repaired",
            "real films starring re-paired leads of other real films (no real pair kept)",
            "movies",
            real_movies_real_actors_repaired,
            lambda: len(real_films()),
        ),
    )
}


def list_worlds() -> list[str]:
    """Names of the built-in worlds."""
    return list(WORLDS)


def get_world(name: str) -> World:
    """The built-in world called ``name``."""
    try:
        return WORLDS[name]
    except KeyError:
        raise UnknownWorldError(
            f"unknown world '{name}' (built-in worlds: {', '.join(WORLDS)}; "
            "a custom world needs --metadata and --templates)"
        ) from None


def check_distinct_entities(records: Iterable[dict], fields: Sequence[str]) -> None:
    """Raise :class:`AmbiguousPromptError` if a value appears twice among ``fields``."""
    where: dict[str, tuple[int, str]] = {}
    for i, rec in enumerate(records):
        for f in fields:
            key = str(rec[f]).casefold()
            if key in where:
                j, g = where[key]
                raise AmbiguousPromptError(
                    f"{rec[f]!r} appears in relation {j} ({g}) and relation {i} ({f}); "
                    "test prompts about it would have two answers"
                )
            where[key] = (i, f)
