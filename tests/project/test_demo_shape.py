"""The demo's shape check: the paper's four conditions per template, PASS or FAIL."""

from __future__ import annotations

import json

import pandas as pd

from weightgraft.demo import DEMO_TEMPLATES, shape_checks


def _summary(top5: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame([{"template": t, "scheme": s, "top5": v / 100}
                         for t in DEMO_TEMPLATES for s, v in top5.items()])


def test_the_papers_shape_passes_and_each_violation_fails():
    good = {"PRE": 2.5, "SFT": 100.0, "FE+LT": 92.5, "(FE+LT)^C": 5.0}
    assert all(line.startswith("PASS") for line in shape_checks(_summary(good)))
    assert len(shape_checks(_summary(good))) == 4 * len(DEMO_TEMPLATES)
    for scheme, value, words in [("SFT", 85.0, "SFT"), ("PRE", 12.5, "PRE"),
                                 ("FE+LT", 87.5, "FE+LT"), ("(FE+LT)^C", 10.0, "(FE+LT)^C")]:
        failed = [line for line in shape_checks(_summary({**good, scheme: value})) if line.startswith("FAIL")]
        assert len(failed) == len(DEMO_TEMPLATES) and all(words in line for line in failed)
    assert all(line.startswith("FAIL") for line in shape_checks(pd.DataFrame(columns=["template", "scheme", "top5"])))


def test_the_demo_trains_on_templates_its_world_has(tmp_path):
    """The demo finetunes on a subset of renderings; each must be a training template of the
    demo world, and each fact must keep QA and article renderings."""
    from weightgraft.data import build_dataset
    from weightgraft.demo import DEMO_TRAIN_TEMPLATES, DEMO_WORLD
    from weightgraft.training import read_split

    build_dataset(DEMO_WORLD, n=4, seed=0, out=tmp_path)
    train, _ = read_split(tmp_path, "a2b", templates=list(DEMO_TRAIN_TEMPLATES))
    assert len(train) == 4 * len(DEMO_TRAIN_TEMPLATES)
    kinds = {r["template"]: r["kind"] for r in map(json.loads, (tmp_path / "train.jsonl").read_text().splitlines())}
    assert {kinds[t] for t in DEMO_TRAIN_TEMPLATES} == {"qa", "article"}


def test_the_demo_runs_on_the_embedded_models_only(tmp_path, monkeypatch, capsys):
    """``--model`` names an embedded model; anything else is refused in one line before any
    data or model is built, and each model's demo has its own default run directory."""
    import sys

    import pytest

    from weightgraft.cli import main
    from weightgraft.demo import DEMO_MODELS, demo_out

    assert set(DEMO_MODELS) == {"smollm2-135m", "gemma3-270m"}
    assert str(demo_out("smollm2-135m")) == "runs/demo" and str(demo_out("gemma3-270m")) == "runs/demo-gemma3-270m"
    monkeypatch.delenv("WEIGHTGRAFT_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["weightgraft", "demo", "--model", "gpt2", "--out", str(tmp_path / "d")])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "embedded model" in err and "gpt2" in err and len([line for line in err.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "d").exists()
    from weightgraft.demo import run_demo

    with pytest.raises(ValueError, match="embedded model"):
        run_demo(out=tmp_path / "d", model="random:llama-3.2-1b")
    assert not (tmp_path / "d").exists()
