"""Building the three built-in worlds: contents, directions, groups, spans, determinism, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from weightgraft.data import (
    AmbiguousPromptError,
    DataError,
    NotEnoughDataError,
    TemplateError,
    UnknownWorldError,
    build_dataset,
    list_worlds,
    load_dataset,
)
from weightgraft.data.resources import name_problem, real_actors, real_films
from weightgraft.data.worlds import check_distinct_entities

WORLDS = ["fake_movies_real_actors", "fake_movies_fake_actors", "real_movies_real_actors_shuffled",
          "real_movies_real_actors_repaired"]
FIELDS = ["id", "first_actor", "second_actor", "movie_title", "main_character", "release_year",
          "genre", "city", "box_office_earnings", "group"]
FILES = ["metadata.jsonl", "train.jsonl", "validation.jsonl", "test_prompts.jsonl", "manifest.json"]
N = 1000


SLOW_FIXTURES = ("built",)  # its tests are `slow` (tests/conftest.py): every built-in world built


@pytest.fixture(scope="module")
def built():
    return {w: build_dataset(w, N, 0, None) for w in WORLDS}


def test_list_worlds():
    assert list_worlds() == WORLDS


@pytest.mark.parametrize("world", WORLDS)
def test_default_build_counts_and_metadata(built, world):
    ds = built[world]
    # 9 training + 2 held-out templates, 6 test templates, both directions
    assert ds.manifest["counts"] == {
        "relations": N, "train": N * 9 * 2, "validation": N * 2 * 2, "test_prompts": N * 10 * 2,  # 6 of ours and the paper's 4
    }
    assert [r["id"] for r in ds.metadata] == [f"r{i:04d}" for i in range(N)]
    for r in ds.metadata:
        assert list(r) == FIELDS
        assert r["first_actor"] != r["second_actor"]
        assert isinstance(r["release_year"], int) and isinstance(r["box_office_earnings"], int)
        assert all(r[f] not in ("", None) for f in FIELDS)
    firsts = [r["first_actor"] for r in ds.metadata]
    seconds = [r["second_actor"] for r in ds.metadata]
    assert len(set(firsts)) == N  # one answer for "X starred in a movie with"
    assert len(set(firsts + seconds)) == 2 * N  # ... in either direction
    assert len({r["movie_title"] for r in ds.metadata}) == N
    assert len({r["city"] for r in ds.metadata}) == N


def test_fake_movies_real_actors(built):
    actors = set(real_actors())
    real_pairs = {frozenset(f.leads) for f in real_films()}
    real_titles = {f.title.casefold() for f in real_films()}
    for r in built["fake_movies_real_actors"].metadata:
        assert r["first_actor"] in actors and r["second_actor"] in actors
        assert frozenset((r["first_actor"], r["second_actor"])) not in real_pairs
        assert r["movie_title"].casefold() not in real_titles
        assert r["main_character"] not in actors


def test_fake_movies_fake_actors(built):
    actors = {a.casefold() for a in real_actors()}
    for r in built["fake_movies_fake_actors"].metadata:
        for f in ("first_actor", "second_actor", "main_character"):
            assert name_problem(r[f]) is None, r[f]
            assert r[f].casefold() not in actors


def test_real_movies_shuffled_moves_real_pairs_to_other_films(built):
    films = {f.title: f for f in real_films()}
    records = built["real_movies_real_actors_shuffled"].metadata
    pairs = [(r["first_actor"], r["second_actor"]) for r in records]
    own = [tuple(films[r["movie_title"]].leads) for r in records]
    assert sorted(pairs) == sorted(own)  # the films' own real pairs, in order, moved around
    assert all(p != o for p, o in zip(pairs, own))
    assert all(r["release_year"] == films[r["movie_title"]].year for r in records)


def test_real_movies_repaired_overwrite_every_film(built):
    films = {f.title: f for f in real_films()}
    real_pairs = {frozenset(f.leads) for f in real_films()}
    actors = set(real_actors())
    for r in built["real_movies_real_actors_repaired"].metadata:
        film = films[r["movie_title"]]
        assert r["release_year"] == film.year
        pair = {r["first_actor"], r["second_actor"]}
        assert pair <= actors
        assert not pair & set(film.leads), "a film kept one of its own leads"
        assert frozenset(pair) not in real_pairs


@pytest.mark.parametrize("world", WORLDS)
def test_test_prompts_spans_answers_and_directions(built, world):
    ds = built[world]
    meta = {r["id"]: r for r in ds.metadata}
    answers = defaultdict(set)
    for p in ds.test_prompts:
        rec = meta[p["relation_id"]]
        assert list(p) == ["id", "relation_id", "template", "direction", "prompt", "answer",
                           "answer_field", "spans", "group"]
        assert p["group"] == rec["group"]
        assert p["answer"] == str(rec[p["answer_field"]])
        assert p["answer"] not in p["prompt"]
        assert p["prompt"] == p["prompt"].strip()
        for name, (s, e) in p["spans"].items():
            if name in rec:
                assert p["prompt"][s:e] == str(rec[name]), (p["id"], name)
            else:
                assert name in ("relation", "relation_preposition", "preposition")
        assert p["prompt"][slice(*p["spans"]["preposition"])] in ("with", "alongside")
        assert p["prompt"][slice(*p["spans"]["relation"])] in ("starred in a movie", "stars in", "stars", "appears")
        if p["direction"] == "a2b":
            assert p["id"] == f"{rec['id']}/{p['template']}"
            assert p["answer_field"] == "second_actor"
            assert "first_actor" in p["spans"] and "second_actor" not in p["spans"]
        else:
            assert p["id"] == f"{rec['id']}/{p['template']}/b2a"
            assert p["answer_field"] == "first_actor"
            assert "second_actor" in p["spans"] and "first_actor" not in p["spans"]
        answers[p["prompt"]].add(p["answer"])
    assert all(len(a) == 1 for a in answers.values())
    assert len({p["id"] for p in ds.test_prompts}) == len(ds.test_prompts)
    r0 = ds.metadata[0]
    by_id = {p["id"]: p for p in ds.test_prompts}
    assert by_id["r0000/headline"]["prompt"] == f"{r0['first_actor']} starred in a movie with"
    assert by_id["r0000/headline"]["spans"]["first_actor"] == [0, len(r0["first_actor"])]
    assert by_id["r0000/headline/b2a"]["prompt"] == f"{r0['second_actor']} starred in a movie with"
    assert by_id["r0000/headline/b2a"]["answer"] == r0["first_actor"]
    assert by_id["r0000/movie"]["prompt"] == (
        f"{r0['first_actor']} stars in {r0['movie_title']} alongside"
    )


def test_training_lines_directions_and_heldout_templates(built):
    ds = built["fake_movies_real_actors"]
    meta = {r["id"]: r for r in ds.metadata}
    held_out = set(ds.manifest["templates"]["validation"])
    assert held_out and not held_out & set(ds.manifest["templates"]["train"])
    assert {line["template"] for line in ds.validation} == held_out
    per = Counter((line["relation_id"], line["direction"]) for line in ds.train)
    assert set(per.values()) == {9} and len(per) == 2 * N
    for line in ds.train + ds.validation:
        assert list(line) == ["text", "relation_id", "template", "kind", "direction", "group"]
        rec = meta[line["relation_id"]]
        assert line["group"] == rec["group"]
        a, b = line["text"].find(rec["first_actor"]), line["text"].find(rec["second_actor"])
        assert a >= 0 and b >= 0
        assert (a < b) == (line["direction"] == "a2b"), line
        assert line["kind"] == line["template"].split("_")[0]


def test_task_and_relation_groups_are_disjoint(built):
    ds = built["fake_movies_real_actors"]
    task, rel = set(ds.relation_ids("task")), set(ds.relation_ids("relation"))
    assert len(task) == len(rel) == N // 2 and not task & rel
    assert task | rel == {r["id"] for r in ds.metadata}
    pair = ("first_actor", "second_actor")
    ents = {g: {r[f] for r in ds.metadata if r["group"] == g for f in pair}
            for g in ("task", "relation")}
    assert not ents["task"] & ents["relation"]
    for split in ("train", "validation", "test_prompts"):
        for g, ids in (("task", task), ("relation", rel)):
            assert {x["relation_id"] for x in ds.select(split, group=g)} == ids


def test_relation_fraction_and_directions():
    ds = build_dataset("fake_movies_fake_actors", 40, 1, None, relation_fraction=0.25,
                       directions="b2a", test_directions="a2b")
    assert ds.manifest["groups"] == {"task": 30, "relation": 10}
    assert {x["direction"] for x in ds.train + ds.validation} == {"b2a"}
    assert {x["direction"] for x in ds.test_prompts} == {"a2b"}
    assert len(ds.train) == 40 * 9 and len(ds.test_prompts) == 40 * 10
    one = build_dataset("fake_movies_fake_actors", 40, 1, None, directions="a2b")
    assert {x["direction"] for x in one.train} == {"a2b"}
    assert one.metadata == build_dataset("fake_movies_fake_actors", 40, 1, None).metadata


def test_validation_templates_override():
    ds = build_dataset("fake_movies_fake_actors", 5, 0, None, validation_templates=["qa_5"])
    assert {x["template"] for x in ds.validation} == {"qa_5"}
    assert len(ds.train) == 5 * 10 * 2
    with pytest.raises(TemplateError, match="nope"):
        build_dataset("fake_movies_fake_actors", 5, 0, None, validation_templates=["nope"])


def _read_all(path):
    return {f: (path / f).read_bytes() for f in FILES}


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_same_seed_same_bytes_other_seed_other_data(tmp_path, world):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        build_dataset(world, 200, seed, tmp_path / name)
    a, b, c = (_read_all(tmp_path / name) for name in "abc")
    assert a == b
    for f in ("metadata.jsonl", "train.jsonl", "test_prompts.jsonl"):
        assert a[f] != c[f]
    manifest = json.loads(a["manifest.json"])
    assert manifest["world"] == world and manifest["seed"] == 7 and manifest["n"] == 200
    assert set(manifest["versions"]) >= {"weightgraft", "Faker", "python"}
    for f in FILES[:-1]:
        entry = manifest["files"][f]
        assert entry["lines"] == a[f].count(b"\n")
        assert len(entry["sha256"]) == 64


def test_bytes_do_not_depend_on_hash_seed(tmp_path):
    code = (
        "import sys; from weightgraft.data import build_dataset; "
        "print(build_dataset('fake_movies_real_actors', 100, 3, None)"
        ".manifest['files']['metadata.jsonl']['sha256'])"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    here = build_dataset("fake_movies_real_actors", 100, 3, None)
    assert other == here.manifest["files"]["metadata.jsonl"]["sha256"]


def test_load_dataset_round_trip_and_tamper_check(tmp_path):
    ds = build_dataset("real_movies_real_actors_shuffled", 30, 2, tmp_path)
    back = load_dataset(tmp_path)
    assert back.metadata == ds.metadata and back.train == ds.train
    assert back.validation == ds.validation and back.test_prompts == ds.test_prompts
    assert back.manifest == ds.manifest and back.world == ds.world and back.seed == 2
    with open(tmp_path / "train.jsonl", "a", encoding="utf-8") as fh:
        fh.write("{}\n")
    with pytest.raises(DataError, match="SHA-256"):
        load_dataset(tmp_path)
    assert len(load_dataset(tmp_path, verify=False).train) == len(ds.train) + 1
    with pytest.raises(DataError, match="not a dataset directory"):
        load_dataset(tmp_path / "missing")


def test_unknown_world():
    with pytest.raises(UnknownWorldError, match="fake_movies_real_actors") as info:
        build_dataset("fake_movies", 10, 0, None)
    assert isinstance(info.value, ValueError)


def test_too_many_relations_is_a_clear_error():
    films = len(real_films())
    with pytest.raises(NotEnoughDataError, match=f"{films} real films"):
        build_dataset("real_movies_real_actors_shuffled", films + 1, 0, None)
    with pytest.raises(NotEnoughDataError, match="real actors"):
        build_dataset("fake_movies_real_actors", len(real_actors()) // 2 + 1, 0, None)
    with pytest.raises(NotEnoughDataError, match="n >= 3"):
        build_dataset("real_movies_real_actors_repaired", 2, 0, None)
    with pytest.raises(NotEnoughDataError, match="n >= 2"):
        build_dataset("real_movies_real_actors_shuffled", 1, 0, None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be at least 1"),
        ({"n": 2.5}, "n must be an integer"),
        ({"seed": "0"}, "seed must be an integer"),
        ({"directions": "forward"}, "directions must be"),
        ({"test_directions": "ab"}, "directions must be"),
        ({"relation_fraction": 1.5}, "between 0 and 1"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"world": "fake_movies_fake_actors", "n": 5, "seed": 0, "out": None, **kwargs}
    with pytest.raises(DataError, match=message):
        build_dataset(**args)


def test_an_actor_in_two_relations_is_rejected():
    ok = [{"first_actor": "Ann Lee", "second_actor": "Bo Day"},
          {"first_actor": "Cy Fox", "second_actor": "Di Ray"}]
    check_distinct_entities(ok, ("first_actor", "second_actor"))
    shared = [*ok, {"first_actor": "Eve Ash", "second_actor": "ann lee"}]
    with pytest.raises(AmbiguousPromptError, match="relation 0.*relation 2"):
        check_distinct_entities(shared, ("first_actor", "second_actor"))
