"""How the folders beside this file were made: by the code before the run-folder core (issue 62),
so that the tests in ``tests/resume/test_old_folders.py`` resume them with today's code.

Run with the old code first on the path, from this folder's parent's parent (``tests/``):
``PYTHONPATH=OLD/src:OLD/tests python tests/resume/old_folders/make.py OUT``. Paths in the configs
are relative (``data``, ``run``), so a test copies a folder and runs from inside it. The paper
run keeps its records only (``stage.json``, and the sweep's ``identity.json``/``manifest.json``):
a resumed paper run reads nothing else to decide that a stage is done.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def make_run(root: Path) -> None:
    from tiny_world import loader, tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    os.chdir(root)
    raw = tiny_config(Path("."), "old-run", world={"n": 3}, report=False, batch_size=8)
    raw.update(data="data", out="run")
    run_experiment(parse_config(raw), load=loader, progress=False)


def make_localize(root: Path) -> None:
    from tiny_world import loader, write_world

    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.run import run_localize

    os.chdir(root)
    write_world(Path("data"), n=3)
    raw = {"name": "old-localize", "data": "data", "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
           "out": "run", "batch_size": 3, "exact_chunk": 64, "exact": 1, "templates": ["headline"],
           "search": {"enabled": False}, "report": False,
           "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}}
    run_localize(parse_localize_config(raw), progress=False, load=loader)


def _base(path: Path) -> None:
    from tiny_world import save_paper_base

    save_paper_base(path)


def make_paper(root: Path) -> None:
    from rich.console import Console

    from weightgraft.paper.pipeline import PaperSettings, run_paper

    os.chdir(root)
    _base(Path("base"))  # named "base" (relative) in every stage key; not kept
    settings = PaperSettings(model="base", relations=8, out=Path("paper"), max_steps=2, batch_size=8,
                             progress=False, sweeps=("position",), claims=False, trained_top5=0.0, both_b2a_top5=0.0)
    run_paper(settings, Console(file=open(os.devnull, "w")))  # noqa: SIM115
    shutil.rmtree("base")
    for path in sorted(Path("paper").rglob("*"), reverse=True):  # the records only
        if path.is_file() and path.name not in ("stage.json", "identity.json", "manifest.json", "settings.json"):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


if __name__ == "__main__":
    out = Path(sys.argv[1]).resolve()
    for name, make in (("run", make_run), ("localize", make_localize), ("paper", make_paper)):
        (out / name).mkdir(parents=True, exist_ok=True)
        make(out / name)
