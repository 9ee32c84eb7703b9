"""A trajectory config (``trajectory: {role: sft}``) reads no file while it is validated: what
it says is checked there, the finetune's snapshots are read by the run's preflight, which
refuses a folder without them in one line before any model loads."""

from __future__ import annotations

import pytest
from tiny_world import tiny_config

from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.runner import run_experiment


def _raw(tmp_path, **extra):
    finetune = tmp_path / "finetune"
    finetune.mkdir(exist_ok=True)
    return tiny_config(tmp_path, "traj", **{"models": {"pre": "tiny-llama:pre", "sft": str(finetune)},
                                            "trajectory": {"role": "sft"}, **extra})


def test_a_trajectory_config_is_validated_without_reading_its_snapshots(tmp_path, monkeypatch):
    import weightgraft.experiments.config as module

    def no_read(*_):
        raise AssertionError("the config read the finetune's snapshots while it was validated")

    with monkeypatch.context() as m:
        m.setattr(module, "_snapshot_sets", no_read)
        config = parse_config(_raw(tmp_path))
    with pytest.raises(ConfigError, match="holds no trajectory") as err:
        config.snapshots()  # read when asked: no trajectory.json in the finetune's folder
    assert "\n" not in str(err.value)


def test_the_runs_preflight_refuses_a_finetune_without_snapshots_before_any_model_loads(tmp_path):
    def no_load(*_):
        raise AssertionError("a model was loaded")

    with pytest.raises(ConfigError, match="holds no trajectory") as err:
        run_experiment(parse_config(_raw(tmp_path)), load=no_load, progress=False)
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("trajectory", "says"), [
    ({"role": "donor"}, "must be a role of 'models'"),
])
def test_what_a_trajectory_says_is_checked_with_the_config(tmp_path, trajectory, says):
    with pytest.raises(ConfigError, match=says):
        parse_config(_raw(tmp_path, trajectory=trajectory))
