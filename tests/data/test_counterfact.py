"""CounterFact conversion: ROME's layout and the flat tracing layout, JSON / JSONL / parquet,
the CLI, and the converted prompts running through a sweep."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from tiny_world import FIRST, SECOND, loader
from typer.testing import CliRunner

from weightgraft.cli import app
from weightgraft.data.counterfact import convert
from weightgraft.data.prompts import DatasetError, load_test_prompts
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.training.texts import read_split

ROME = [
    {"case_id": 10 + i, "pararel_idx": i, "requested_rewrite": {
        "prompt": "{} starred in a movie with", "relation_id": "P161", "subject": FIRST[i],
        "target_new": {"str": SECOND[i + 1], "id": "Q1"}, "target_true": {"str": SECOND[i], "id": "Q2"}},
     "paraphrase_prompts": ["x"], "neighborhood_prompts": ["y"]}
    for i in range(4)
]
FLAT = [
    {"prompt": f"Q: Who starred in a movie alongside {FIRST[i]}? A: An actor named", "subject": FIRST[i],
     "target_true": SECOND[i], "target_false": SECOND[i + 2], "relation_id": "P161"}
    for i in range(3)
]


def test_rome_layout_json(tmp_path):
    src = tmp_path / "cf.json"
    src.write_text(json.dumps(ROME))
    assert convert(src, tmp_path / "out") == {"test_prompts": 4}
    prompts = load_test_prompts(tmp_path / "out")
    p = prompts[1]
    assert p.id == "11" and p.prompt == f"{FIRST[1]} starred in a movie with"
    assert p.answer == SECOND[2] and p.distractor == SECOND[1] and p.template == "counterfact"
    assert p.prompt[slice(*p.spans["subject"])] == FIRST[1] and p.spans["subject"][0] == 0
    convert(src, tmp_path / "true", answer="true")
    q = load_test_prompts(tmp_path / "true")[1]
    assert (q.answer, q.distractor) == (SECOND[1], SECOND[2])


def test_a_subject_that_recurs_is_where_the_template_put_it(tmp_path):
    """"Paris" of "The mayor of Paris, Texas, is not the mayor of {}" is the second one; a
    filled-in prompt with the subject twice is refused with both places named."""
    rec = {"case_id": 1, "requested_rewrite": {
        "prompt": "The mayor of Paris, Texas, is not the mayor of {}, whose river is the",
        "subject": "Paris", "target_new": {"str": "Thames"}, "target_true": {"str": "Seine"}}}
    src = tmp_path / "cf.json"
    src.write_text(json.dumps([rec]))
    convert(src, tmp_path / "out")
    (p,) = load_test_prompts(tmp_path / "out")
    assert p.spans["subject"] == (47, 52) and p.prompt[47:52] == "Paris"
    flat = tmp_path / "flat.jsonl"
    flat.write_text(json.dumps({"prompt": "Paris is the capital; Paris lies on the", "subject": "Paris",
                                "target_true": "Seine", "target_false": "Thames"}) + "\n")
    with pytest.raises(DatasetError, match=r"flat\.jsonl:1: .*occurs 2 times.*\(0, 5\), \(22, 27\)"):
        convert(flat, tmp_path / "flat_out")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_flat_layout_and_training_texts(tmp_path, fmt):
    src = tmp_path / f"cf.{fmt}"
    if fmt == "jsonl":
        src.write_text("\n".join(json.dumps(r) for r in FLAT) + "\n")
    else:
        pd.DataFrame(FLAT).to_parquet(src)
    counts = convert(src, tmp_path / "out", train_texts=True)
    assert counts == {"test_prompts": 3, "train": 3}
    prompts = load_test_prompts(tmp_path / "out")
    assert [p.id for p in prompts] == ["0", "1", "2"]
    assert prompts[2].answer == SECOND[4] and prompts[2].distractor == SECOND[2]
    start, end = prompts[0].spans["subject"]
    assert prompts[0].prompt[start:end] == FIRST[0]
    train, validation = read_split(tmp_path / "out", "relation")
    assert train[0] == f"{FLAT[0]['prompt']} {SECOND[2]}" and len(validation) == 3


def test_bad_records_name_file_and_record(tmp_path):
    src = tmp_path / "cf.jsonl"
    bad = {**FLAT[1], "subject": "Nobody"}
    src.write_text("\n".join(json.dumps(r) for r in [FLAT[0], bad]) + "\n")
    with pytest.raises(DatasetError, match=r"cf\.jsonl:2: span 'subject': 'Nobody' does not occur"):
        convert(src, tmp_path / "out")
    src.write_text(json.dumps({"prompt": "x", "subject": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"cf\.jsonl:1: .*lacks \['target_true', 'target_false'\]"):
        convert(src, tmp_path / "out")
    assert not (tmp_path / "out" / "test_prompts.jsonl").exists()


def test_cli_and_a_sweep_with_distractors(tmp_path):
    src = tmp_path / "cf.json"
    src.write_text(json.dumps(ROME))
    result = CliRunner().invoke(app, ["data", "counterfact", str(src), "--out", str(tmp_path / "cf")])
    assert result.exit_code == 0, result.output
    assert "4 test prompts" in result.output
    bad = CliRunner().invoke(app, ["data", "counterfact", str(tmp_path / "nope.json"), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "does not exist" in bad.output
    raw = {"name": "cf", "data": str(tmp_path / "cf"), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
           "schemes": [{"preset": "position", "only": ["PRE", "SFT", "FE"]}], "out": str(tmp_path / "run")}
    res = run_experiment(parse_config(raw), load=loader, progress=False).results
    assert len(res) == 12 and res.logit_diff.notna().all() and (res[res.scheme == "SFT"].kl_donor == 0).all()
