"""Shuffled-answers datasets (a null finetune): every training line names another fact's answer."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from weightgraft.cli.data import app
from weightgraft.data import DataError, build_dataset, load_dataset

WORLD = "fake_movies_real_actors"


@pytest.fixture(scope="module")
def worlds():
    return build_dataset(WORLD, 40, 0), build_dataset(WORLD, 40, 0, shuffled_answers=True)


def test_every_training_line_names_another_facts_partner(worlds):
    true, shuffled = worlds
    by_id = {r["id"]: r for r in true.metadata}
    answer_from = shuffled.manifest["shuffled_answers"]["answer_from"]
    assert sorted(answer_from) == sorted(by_id)
    lines = shuffled.train + shuffled.validation
    assert len(lines) == len(true.train) + len(true.validation) > 0
    for line in lines:
        rid = line["relation_id"]
        donor = answer_from[rid]
        assert donor != rid
        rec = by_id[rid]
        assert rec["first_actor"] in line["text"]
        assert by_id[donor]["second_actor"] in line["text"]
        assert rec["second_actor"] not in line["text"]


def test_partner_multiset_unchanged_and_draw_is_a_permutation(worlds):
    true, shuffled = worlds
    answer_from = shuffled.manifest["shuffled_answers"]["answer_from"]
    assert sorted(answer_from.values()) == sorted(answer_from)  # each donor used once
    by_id = {r["id"]: r for r in true.metadata}
    taught = Counter(by_id[answer_from[r["id"]]]["second_actor"] for r in true.metadata)
    assert taught == Counter(r["second_actor"] for r in true.metadata)
    # the training text holds the same answer multiset as the true build's
    for split in ("train", "validation"):
        names_true = Counter(
            a["second_actor"] for line in getattr(true, split)
            for a in true.metadata if a["second_actor"] in line["text"]
        )
        names_shuf = Counter(
            a["second_actor"] for line in getattr(shuffled, split)
            for a in true.metadata if a["second_actor"] in line["text"]
        )
        assert names_true == names_shuf


def test_test_prompts_and_metadata_are_the_true_build(worlds):
    true, shuffled = worlds
    assert shuffled.test_prompts == true.test_prompts
    assert shuffled.metadata == true.metadata
    assert true.manifest["shuffled_answers"] is None
    entry = shuffled.manifest["shuffled_answers"]
    assert entry["field"] == "second_actor" and entry["seed"] == 0
    # the same line layout: only the texts differ
    strip = [{k: v for k, v in x.items() if k != "text"} for x in true.train]
    assert strip == [{k: v for k, v in x.items() if k != "text"} for x in shuffled.train]
    assert all(a["text"] != b["text"] for a, b in zip(true.train, shuffled.train, strict=True))


def test_shuffle_is_seeded():
    a = build_dataset(WORLD, 12, 3, shuffled_answers=True).manifest["shuffled_answers"]
    b = build_dataset(WORLD, 12, 3, shuffled_answers=True).manifest["shuffled_answers"]
    c = build_dataset(WORLD, 12, 4, shuffled_answers=True).manifest["shuffled_answers"]
    assert a == b and a["answer_from"] != c["answer_from"]


def test_one_relation_cannot_be_shuffled():
    with pytest.raises(DataError, match="at least two relations"):
        build_dataset(WORLD, 1, 0, shuffled_answers=True)


def test_cli_flag_writes_a_loadable_shuffled_dataset(tmp_path):
    out = tmp_path / "ds"
    res = runner_invoke(["build", "--world", WORLD, "--n", "10", "--seed", "0",
                         "--shuffle-answers", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "shuffled answers" in res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shuffled_answers"]["field"] == "second_actor"
    ds = load_dataset(out)
    assert ds.test_prompts == build_dataset(WORLD, 10, 0).test_prompts


def runner_invoke(args: list[str]):
    return CliRunner().invoke(app, args)
