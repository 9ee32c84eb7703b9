"""``checkpoint(DIR, step=K)``: a finetune's snapshot named by its step wherever a model is
accepted. It reads back as the folder ``train --save-every`` writes, loads the same weights as
that folder, is refused before loading when the step was not saved (naming the saved ones), and
a config's relative DIR is taken from the config's folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from weightgraft.configfile import read_yaml_config
from weightgraft.models import load_model
from weightgraft.models.errors import ModelNotFoundError, ModelSpecError
from weightgraft.models.spec import CheckpointSpec, parse_spec, saved_steps, snapshot_dir
from weightgraft.training.trajectory import snapshot_dir as training_snapshot_dir


@pytest.fixture()
def finetune_dir(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> Path:
    """A finetune's folder holding snapshots after steps 1 and 4 (the tiny pair's models)."""
    out = tmp_path / "runs" / "sft"
    shutil.copytree(tiny_model_dirs["pre"], snapshot_dir(out, 1))
    shutil.copytree(tiny_model_dirs["sft"], snapshot_dir(out, 4))
    return out


def test_a_checkpoint_spec_reads_back_as_the_snapshot_folder_training_writes(tmp_path: Path) -> None:
    spec = parse_spec(" checkpoint(runs/sft, step=40) ")
    assert isinstance(spec, CheckpointSpec) and (spec.run, spec.step) == ("runs/sft", 40)
    assert spec.folder == Path("runs/sft/trajectory/step-000040") == training_snapshot_dir("runs/sft", 40)
    assert spec.text == " checkpoint(runs/sft, step=40) " and CheckpointSpec(run="runs/sft", step=40).text == "checkpoint(runs/sft, step=40)"
    assert parse_spec(CheckpointSpec(run="runs/sft", step=40).text) == spec
    assert not spec.derived and spec.by_name and spec.refs() == ()


@pytest.mark.parametrize("bad", ["checkpoint(runs/sft)", "checkpoint(step=3)", "checkpoint(runs/sft, step=x)",
                                 "checkpoint(runs/sft, k=3)", "checkpoint(runs/sft, step=-1)", "checkpoint(runs"])
def test_a_malformed_checkpoint_spec_is_one_line(bad: str) -> None:
    with pytest.raises(ModelSpecError, match=r"checkpoint\(DIR, step=K\)") as err:
        parse_spec(bad)
    assert "\n" not in str(err.value)


def test_a_checkpoint_loads_the_weights_of_its_folder(finetune_dir: Path) -> None:
    by_step = load_model(f"checkpoint({finetune_dir}, step=4)", dtype=__import__("torch").float64)
    by_folder = load_model(str(snapshot_dir(finetune_dir, 4)), dtype=__import__("torch").float64)
    first = load_model(f"checkpoint({finetune_dir}, step=1)", dtype=__import__("torch").float64)
    assert by_step.weights_sha256 == by_folder.weights_sha256 != first.weights_sha256
    assert isinstance(by_step.spec, CheckpointSpec) and by_step.spec.step == 4
    assert saved_steps(finetune_dir) == [1, 4]


def test_a_step_that_was_not_saved_is_refused_before_loading(finetune_dir: Path, monkeypatch) -> None:
    def never(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("weightgraft.models.loading.read_location", never)
    spec = parse_spec(f"checkpoint({finetune_dir}, step=3)")
    for attempt in (lambda: spec.check("models.sft ="), lambda: load_model(spec)):
        with pytest.raises(ModelNotFoundError, match="no snapshot after step 3 .*saved: 1, 4") as err:
            attempt()
        assert "\n" not in str(err.value)
    with pytest.raises(ModelNotFoundError, match="holds none: finetune with `weightgraft train ... --save-every N`"):
        parse_spec(f"checkpoint({finetune_dir.parent}, step=3)").check()


def test_a_config_takes_a_relative_checkpoint_dir_from_its_folder(finetune_dir: Path) -> None:
    root = finetune_dir.parent.parent
    config = root / "configs" / "sweep.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({"models": {"pre": "x", "sft": "checkpoint(../runs/sft, step=4)"}}))
    raw = read_yaml_config(config)
    spec = parse_spec(raw["models"]["sft"])
    assert isinstance(spec, CheckpointSpec) and spec.step == 4
    assert Path(spec.run).resolve() == finetune_dir.resolve()
    spec.check()  # the snapshot is found from anywhere
