"""A paper figure is declared once (``weightgraft.paper.figures``): each ``configs/paper/SWEEP.yaml``
(the command a reader runs by hand) must say what the pipeline's sweep of that name runs: the
protocol, the schemes, the test sentences, the directions, the groups and the model roles. Only
the paths (data, models) and the comments are the file's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from weightgraft.paper.figures import MAIN_WORLD, sweep_config, sweeps_for

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "paper"
SWEEPS = {s.name: s for s in sweeps_for(MAIN_WORLD)}
OWN = {"position_gentle": "position"}  # Fig. 13 runs position.yaml on the gentle finetune (docs/paper.md)
KEYS = ("protocol", "schemes", "templates", "directions", "groups")


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_each_paper_config_says_what_the_pipelines_sweep_runs(name: str) -> None:
    path = CONFIGS / f"{OWN.get(name, name)}.yaml"
    assert path.is_file(), f"{path} is missing: the sweep {name} has no config a reader can run"
    written = yaml.safe_load(path.read_text(encoding="utf-8"))
    sweep = SWEEPS[name]
    declared = sweep_config(sweep, dict.fromkeys(sweep.roles, "MODEL"), "DATA", device="cpu", seed=0, batch_size=None)
    assert sorted(written["models"]) == sorted(declared["models"])
    for key in KEYS:
        assert written.get(key) == declared.get(key), (name, key)


def test_every_paper_config_is_a_declared_sweep() -> None:
    names = {p.stem for p in CONFIGS.glob("*.yaml")}
    extra = names - set(SWEEPS) - {"differences_authors", "differences_paper"}  # the protocol comparisons, not figures
    assert extra == set()
