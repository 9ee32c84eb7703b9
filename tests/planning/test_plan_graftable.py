"""Roles that cannot be grafted together are refused from their configs alone, in one line naming
both models and the first difference, by ``weightgraft plan`` and by ``run`` / ``localize``
before any weight is read; a failure of the plan that is not about the input is raised."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import make_tiny
from tiny_world import write_world
from typer.testing import CliRunner

from weightgraft.engine.compat import ModelMismatchError


@pytest.fixture
def other_dirs(tmp_path: Path, tiny_tok) -> dict[str, Path]:
    """A tiny Gemma 3 and a tiny Llama with one layer more than the suite's tiny pair."""
    out = {}
    for name, model in (("gemma", make_tiny("gemma3_text", vocab_size=len(tiny_tok))),
                        ("deeper", make_tiny("llama", vocab_size=len(tiny_tok), n_layers=5))):
        model.save_pretrained(tmp_path / name)
        tiny_tok.save_pretrained(tmp_path / name)
        out[name] = tmp_path / name
    return out


def _raw(tmp_path: Path, pre: Path, sft: Path) -> dict:
    return {"data": str(write_world(tmp_path / "data")), "models": {"pre": str(pre), "sft": str(sft)},
            "schemes": [{"preset": "position"}], "out": str(tmp_path / "run"), "report": False}


@pytest.mark.parametrize("other, first_difference", [
    ("gemma", "sft is a 'gemma3_text' model, pre a 'llama' model"),
    ("deeper", "sft has a tensor 'model.layers.4.self_attn.q_proj.weight' that pre lacks"),
])
def test_plan_and_run_refuse_a_pair_that_cannot_be_grafted(tmp_path, tiny_model_dirs, other_dirs, monkeypatch,
                                                            other, first_difference):
    import yaml

    from weightgraft.cli import app
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    raw = _raw(tmp_path, tiny_model_dirs["pre"], other_dirs[other])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["plan", str(path), "--no-time"])  # the entry point prints it in one line
    assert isinstance(result.exception, ModelMismatchError) and first_difference in str(result.exception)
    assert f"cannot be grafted into pre ({tiny_model_dirs['pre']})" in str(result.exception)
    monkeypatch.setattr("weightgraft.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ModelMismatchError, match="cannot be grafted") as err:
        run_experiment(parse_config(raw), progress=False)
    assert "\n" not in str(err.value)


def test_localize_refuses_a_pair_that_cannot_be_grafted_before_loading(tmp_path, tiny_model_dirs, other_dirs,
                                                                       monkeypatch):
    from weightgraft.api.localize import localize
    from weightgraft.localization.config import parse_localize_config

    raw = {"data": str(write_world(tmp_path / "data")), "out": str(tmp_path / "loc"), "exact": "none",
           "models": {"pre": str(tiny_model_dirs["pre"]), "sft": str(other_dirs["gemma"])},
           "claims": {"enabled": False}, "search": {"enabled": False}}
    monkeypatch.setattr("weightgraft.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ModelMismatchError, match=r"sft \(.*\) cannot be grafted into pre"):
        localize(parse_localize_config(raw), progress=False)


def test_a_bug_while_planning_is_raised_not_skipped(tmp_path, tiny_model_dirs, monkeypatch):
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    def broken(*a, **k):
        raise ZeroDivisionError("a bug in the plan")

    monkeypatch.setattr("weightgraft.experiments.plan.plan_experiment", broken)
    with pytest.raises(ZeroDivisionError, match="a bug in the plan"):
        run_experiment(parse_config(_raw(tmp_path, tiny_model_dirs["pre"], tiny_model_dirs["sft"])), progress=False)


def test_a_pair_no_single_card_holds_says_how_many_cards_device_map_needs(tmp_path):
    """Two 8B models (~30 GiB each in bfloat16) on a 24 GB card: no change fits one card, and the
    refusal counts the cards ``device_map=auto`` needs from the bfloat16 peak at batch 1."""
    import math
    import re

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.plan import plan_experiment
    from weightgraft.planning.cards import card
    from weightgraft.planning.sizes import gib

    raw = {"data": str(write_world(tmp_path / "data")), "device": "cuda", "tokenizer": "bytes",
           "models": {"pre": "random:llama-3.1-8b", "sft": "random:llama-3.1-8b@1"},
           "schemes": [{"preset": "position"}], "out": str(tmp_path / "run")}
    rtx = card("rtx4090-24gb")
    plan = plan_experiment(parse_config(raw), gpu=rtx, with_time=False)
    assert not plan.fits and not plan.suggestions
    found = re.search(r"device_map=auto needs at least (\d+) rtx4090-24gb cards \(([\d.]+) GiB in bfloat16", plan.least)
    assert found, plan.least
    need = float(found.group(2))
    assert int(found.group(1)) == math.ceil(need / float(gib(plan.budget_bytes).split()[0]))
    assert int(found.group(1)) >= 2
