"""What is wrong is said first, once, before any model loads: a model path that does not exist
(even over a finished run, which must not be blamed), a component typo, a directory or file
that is not a model, a donor that is not a model object."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from tiny_world import tiny_config

import weightgraft as wg
from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.models.spec import parse_spec


@pytest.fixture
def saved(world_model_dirs: dict[str, str]) -> dict[str, str]:
    return world_model_dirs


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weightgraft", *args], capture_output=True, text=True,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def _write(tmp_path, raw) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.slow
def test_a_missing_model_over_a_finished_run_is_a_missing_model(tmp_path, saved):
    raw = tiny_config(tmp_path, "ff", world={"n": 2}, models=saved,
                      schemes=[{"preset": "position", "only": ["PRE", "SFT", "LT"]}])
    run_experiment(parse_config(raw), progress=False)
    nope = str(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match=r"model 'sft' = '.*nope' does not exist"):
        run_experiment(parse_config({**raw, "models": {**saved, "sft": nope}}), progress=False)
    proc = _cli("run", _write(tmp_path, raw), f"models.sft={nope}", "--no-progress")
    assert proc.returncode != 0
    said = " ".join(proc.stderr.split())  # the console wraps the one line at its width
    assert said.count("error:") == 1 and said.count("does not exist") == 1, said
    assert "ResultsDirConflict" not in said and "delete" not in said
    assert "Loading weights" not in proc.stderr  # not even 'pre' was loaded


@pytest.mark.slow
def test_a_component_typo_is_refused_with_the_config_once(tmp_path, saved):
    bad = [{"name": "typo", "rules": [{"model": "sft", "positions": "last", "components": "o+fnn"}]}]
    raw = tiny_config(tmp_path, "typo", world={"n": 2}, models=saved, schemes=bad)
    with pytest.raises(ConfigError, match=r"components: .*unknown component 'fnn' in 'o\+fnn'"):
        parse_config(raw)
    with pytest.raises(wg.WeightgraftError, match="unknown component 'fnn'") as err:  # a ValueError too
        wg.Rule(model="sft", components="o+fnn")
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value) and "http" not in str(err.value)
    with pytest.raises(wg.WeightgraftError, match="colour: Extra inputs are not permitted"):
        wg.Scheme(name="x", colour=1)
    wg.Rule(model="sft", components="o+ffn-down")  # a well-formed one is accepted
    proc = _cli("run", _write(tmp_path, raw), "--no-progress")
    assert proc.returncode != 0
    said = " ".join(proc.stderr.split())
    assert said.count("unknown component 'fnn'") == 1 and said.count("error:") == 1, said
    assert "Loading weights" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_paths_that_are_not_models_are_refused_before_loading(tmp_path, saved):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (tmp_path / "notes.txt").write_text("x")
    for spec, message in ((str(tmp_path / "nope"), "does not exist"),
                          (str(data_dir), "is a directory but not a model: it holds no config.json"),
                          (str(tmp_path / "notes.txt"), "is a file but not a .gguf file"),
                          ("someone/not-cached-model-xyz", "no hub id in the local Hugging Face cache")):
        with pytest.raises(ModelLoadError, match=message):
            parse_spec(spec).check("model 'sft' =")
    for spec in (saved["pre"], "random:smollm2-135m", "smollm2-135m"):
        parse_spec(spec).check()  # models: no error, nothing loaded
    raw = tiny_config(tmp_path, "dir", world={"n": 2}, models={**saved, "sft": str(data_dir)},
                      schemes=[{"preset": "position", "only": ["PRE", "LT"]}])
    proc = _cli("run", _write(tmp_path, raw), "--no-progress")
    said = " ".join(proc.stderr.split())
    assert proc.returncode != 0 and said.count("holds no config.json") == 1, said
    assert "Loading weights" not in proc.stderr


@pytest.mark.parametrize("donor", ["models/sft", None, 3])
def test_a_donor_that_is_not_a_model_is_one_line(tiny_pair, tiny_tok, donor):
    pre, _ = tiny_pair("llama")
    with pytest.raises(wg.GraftInputError, match=r"model 'sft' is a \w+, not a Hugging Face model"):
        wg.graft({"pre": pre, "sft": donor}, tiny_tok, ["Hi there"], wg.Rule(model="sft", positions="last"))
