"""Folders written by the code before the run-folder core (``old_folders/``, made by its
``make.py`` with that code): today's code resumes each pipeline's (``run``, ``localize``,
``paper``) or refuses it in the one line it was refused with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from weightgraft.errors import ResultsDirConflict

OLD = Path(__file__).parent / "old_folders"

pytestmark = pytest.mark.slow  # tiny runs resumed end to end, each over 1 s


@pytest.fixture
def old(tmp_path, monkeypatch):
    """A copy of the old folders, run from inside (their configs' paths are relative)."""
    for name in ("run", "localize", "paper"):
        shutil.copytree(OLD / name, tmp_path / name)
    return tmp_path


def _run_config(**extra):
    from weightgraft.experiments.config import parse_config

    return parse_config({**json.loads(Path("run/identity.json").read_text())["config"], **extra})


def test_an_old_sweep_resumes_computing_only_the_rows_it_lacks(old, monkeypatch):
    from tiny_world import loader

    from weightgraft.experiments.runner import run_experiment

    monkeypatch.chdir(old / "run")
    saved = pd.concat(pd.read_parquet(p) for p in sorted(Path("run/parts").glob("*.parquet")))
    resumed = run_experiment(_run_config(), load=loader, progress=False)
    assert resumed.computed == 48 - len(saved) and len(resumed.results) == 48
    fresh = run_experiment(_run_config(out="fresh"), load=loader, progress=False)
    pd.testing.assert_frame_equal(resumed.results, fresh.results)
    sessions = json.loads(Path("run/manifest.json").read_text())["sessions"]
    assert [s["computed_this_run"] for s in sessions] == [48, 48 - len(saved)]  # the old session kept
    from weightgraft.report import write_report

    assert write_report(Path("run")).html.is_file()  # the typed manifest reads a resumed folder


@pytest.mark.parametrize(("change", "says"), [
    ({"rows_format": 2}, r"holds rows in format 2 \(an earlier weightgraft\)"),
    ({"core": "0" * 16}, "holds results of another experiment config"),
    ({"examples": {"r0000/headline": "changed"}}, r"rows computed from 1 test prompt\(s\) that have changed"),
    ({"models": {"default": {"sft": "other"}}}, "other weights for model 'sft' of model set 'default'"),
])
def test_an_old_sweep_of_other_inputs_is_refused_in_its_line(old, monkeypatch, change, says):
    from tiny_world import loader

    from weightgraft.experiments.runner import run_experiment

    monkeypatch.chdir(old / "run")
    claim = json.loads(Path("run/identity.json").read_text())
    Path("run/identity.json").write_text(json.dumps({**claim, **change}))
    with pytest.raises(ResultsDirConflict, match=says) as err:
        run_experiment(_run_config(), load=loader, progress=False)
    assert "\n" not in str(err.value)


def _localize_config(**extra):
    from weightgraft.localization.config import parse_localize_config

    return parse_localize_config({**json.loads(Path("run/manifest.json").read_text())["config"], **extra})


def test_an_old_localize_run_resumes_computing_again_only_its_claims(old, monkeypatch):
    """Made with claims rules 8: its maps and estimates are read back; its claims parts, keyed by
    the rules, are judged again by today's (rules 9), beside the old ones, which stay as they were."""
    from tiny_world import loader

    from weightgraft.localization.run import run_localize

    monkeypatch.chdir(old / "localize")
    parts = {p: p.stat().st_mtime_ns for p in Path("run/parts").rglob("*.parquet")}
    resumed = run_localize(_localize_config(), progress=False, load=loader)
    after = {p: p.stat().st_mtime_ns for p in Path("run/parts").rglob("*.parquet")}
    assert {p: after[p] for p in parts} == parts  # nothing written before is touched
    new = sorted(p.name for p in set(after) - set(parts))
    assert new and all(name.startswith("claims_") for name in new), new  # only the claims are computed again
    fresh = run_localize(_localize_config(out="fresh"), progress=False, load=loader)
    pd.testing.assert_frame_equal(resumed.cells, fresh.cells)
    manifest = json.loads(Path("run/manifest.json").read_text())
    assert manifest["identity"] == "838cc9e09c8193e7" and manifest["n_prompts"] == {"headline": 3}
    # appending an SFT model extends the run
    run_localize(_localize_config(models={"pre": "tiny-llama:pre", "sft": ["tiny-llama:sft", "tiny-llama:task"]},
                                  claims={"enabled": False}), progress=False, load=loader)


@pytest.mark.parametrize(("change", "config", "says"), [
    ({"labels": 1}, {}, "position labels of version 1"),
    ({}, {"metric": "neg_kl_donor"}, "holds a localize run of another config"),
    ({}, {"models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:task"}}, "holds a localize run of another config"),
    ({"examples": {"headline/r0000/headline": "changed"}}, {}, r"cells of 1 prompt\(s\) whose content has changed"),
])
def test_an_old_localize_run_of_other_inputs_is_refused_in_its_line(old, monkeypatch, change, config, says):
    from tiny_world import loader

    from weightgraft.localization.run import run_localize

    monkeypatch.chdir(old / "localize")
    manifest = json.loads(Path("run/manifest.json").read_text())
    Path("run/manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(ResultsDirConflict, match=says) as err:
        run_localize(_localize_config(**config), progress=False, load=loader)
    assert "\n" not in str(err.value)


def test_an_old_localize_list_cut_short_is_refused(old, monkeypatch):
    from weightgraft.localization.run import _claim

    monkeypatch.chdir(old / "localize")
    manifest = json.loads(Path("run/manifest.json").read_text())
    manifest["config"]["models"]["sft"] = ["tiny-llama:sft", "tiny-llama:task"]
    Path("run/manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResultsDirConflict, match=r"maps of the SFT models \['tiny-llama:sft', 'tiny-llama:task'\]"):
        _claim(Path("run"), _localize_config(models={"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}), [])


def test_an_old_paper_runs_stages_are_found_by_todays_keys(old, monkeypatch):
    from rich.console import Console

    from weightgraft.paper.figures import FINETUNES, sweeps_for
    from weightgraft.paper.pipeline import PaperSettings, data_stage, finetune_stage, run_sweep, sweep_stage

    monkeypatch.chdir(old / "paper")
    settings = PaperSettings(model="base", relations=8, out=Path("paper"), max_steps=2, batch_size=8, progress=False,
                             sweeps=("position",), claims=False, trained_top5=0.0, both_b2a_top5=0.0)
    data = data_stage(settings).finished()
    assert data is not None and data.outputs.dir == "data"
    finetune = finetune_stage(settings, FINETUNES["a2b"], data).finished()
    assert finetune is not None and finetune.outputs.checks
    sweep = next(s for s in sweeps_for(settings.world) if s.name == "position")
    stage, _ = sweep_stage(settings, sweep, data, {"a2b": finetune})
    done = stage.finished()
    assert done is not None and done.outputs.summary
    record, reused = run_sweep(settings, sweep, data, {"a2b": finetune}, Console(quiet=True))
    assert reused and record == done  # nothing run again
    changed = PaperSettings(model="base", relations=8, out=Path("paper"), seed=1)
    assert data_stage(changed).finished() is None  # other inputs: another folder
