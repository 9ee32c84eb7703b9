"""The shipped actor and film lists: size, cleanliness, uniqueness."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from weightgraft.data.resources import movie_settings, name_problem, real_actors, real_films


def _raw(name: str) -> str:
    return (resources.files("weightgraft.data") / "resources" / name).read_text(encoding="utf-8")


def test_actor_list_is_large_clean_and_unique():
    actors = real_actors()
    assert len(actors) >= 1500
    folded = [a.casefold() for a in actors]
    assert len(set(folded)) == len(folded)
    for a in actors:
        assert name_problem(a) is None, a
        assert a == a.strip() and "  " not in a
        assert len(a.split()) >= 2
        assert not any(w.rstrip(".").lower() in {"jr", "sr", "ii", "iii"} for w in a.split())
        assert not any(ch.isdigit() for ch in a)


def test_actor_file_has_no_junk_lines():
    lines = _raw("real_actors.txt").split("\n")
    assert lines[-1] == ""  # ends with a newline
    body = [ln for ln in lines[:-1] if not ln.startswith("#")]
    assert all(ln and ln == ln.strip() for ln in body)
    assert len(body) == len(real_actors())


@pytest.mark.parametrize(
    "bad",
    ["Robert Downey Jr.", "Sammy Davis Jr", "Cher", " Tom Hanks", "Tom Hanks ", "Tom  Hanks",
     "tom hanks", "Tom Hanks III", "R2 D2", "Tom\tHanks"],
)
def test_name_problem_rejects_junk(bad):
    assert name_problem(bad) is not None


@pytest.mark.parametrize("good", ["Samuel L. Jackson", "Lupita Nyong'o", "Daniel Day-Lewis",
                                  "Max von Sydow", "Penélope Cruz"])
def test_name_problem_accepts_real_names(good):
    assert name_problem(good) is None


def test_film_list_is_large_and_leads_are_distinct():
    films = real_films()
    assert len(films) >= 300
    titles = [f.title.casefold() for f in films]
    assert len(set(titles)) == len(titles)
    leads = [a.casefold() for f in films for a in f.leads]
    assert len(set(leads)) == len(leads), "an actor leads two films"
    known = {a.casefold() for a in real_actors()}
    for f in films:
        assert f.title == f.title.strip() and f.title
        assert 1900 < f.year <= 2025
        assert f.leads[0] != f.leads[1]
        for a in f.leads:
            assert name_problem(a) is None, (f.title, a)
            assert a.casefold() in known, (f.title, a)


def test_film_file_is_valid_jsonl():
    for line in _raw("real_films.jsonl").splitlines():
        row = json.loads(line)
        assert set(row) == {"title", "year", "leads"}


def test_movie_settings():
    s = movie_settings()
    assert "science fiction" in s.genres and len(set(s.genres)) == len(s.genres)
    assert s.release_year[0] <= s.release_year[1]
    assert s.box_office_earnings[0] <= s.box_office_earnings[1]
    assert all("{Noun}" in p for p in s.title_patterns)
