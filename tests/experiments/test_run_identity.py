"""A run is tied to its inputs (issue 14): a resume never mixes old and new inputs, a failed
run leaves no claim on its folder, a rerun that only adds work extends the run, and every
session's timing is kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from tiny_world import loader, tiny_config

from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.experiments.store import ResultsDirConflict
from weightgraft.models import ModelNotFoundError

pytestmark = pytest.mark.slow  # `make check` leaves these out: runs killed, changed, resumed; each over 1 s

TESTS = Path(__file__).parent.parent


def _raw(tmp_path, **extra) -> dict:
    return tiny_config(tmp_path, "ident", **{"batch_size": 1, **extra})


def _run(raw, load=loader):
    return run_experiment(parse_config(raw), load=load, progress=False)


def _kill_after_parts(tmp_path, raw, n_parts: int) -> None:
    """Start a real run in a subprocess and SIGKILL it once ``n_parts`` parts are saved."""
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(TESTS / "tiny_world.py"), str(path)], env=env)
    parts = Path(raw["out"]) / "parts"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if parts.exists() and len(list(parts.glob("part-*.parquet"))) >= n_parts:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_killed_run_then_rebuilt_dataset_is_refused_not_mixed(tmp_path):
    raw = _raw(tmp_path)
    _kill_after_parts(tmp_path, raw, 5)
    # the dataset is rebuilt into the same folder with other answers (another seed would do this)
    prompts = tmp_path / "data" / "test_prompts.jsonl"
    records = [json.loads(line) for line in prompts.read_text().splitlines()]
    for rec in records:
        rec["answer"] = "Tom Hanks"
    prompts.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    with pytest.raises(ResultsDirConflict, match=r"test prompt\(s\) that have changed.*start afresh"):
        _run(raw)


def test_killed_run_then_other_weights_is_refused_not_mixed(tmp_path):
    raw = _raw(tmp_path)
    _kill_after_parts(tmp_path, raw, 5)

    def retrained(spec, config=None):  # same path, new weights: another content hash
        lm = loader(spec, config)
        return SimpleNamespace(**{**vars(lm), "weights_sha256": "other-" + lm.weights_sha256}) if spec.endswith(":sft") else lm

    with pytest.raises(ResultsDirConflict, match="other weights for model 'sft'"):
        _run(raw, load=retrained)
    resumed = _run(raw)  # the original weights resume as before
    clean = _run(_raw(tmp_path, out=str(tmp_path / "clean")))
    pd.testing.assert_frame_equal(resumed.results, clean.results)


def test_failed_run_leaves_no_claim_and_the_corrected_command_runs(tmp_path):
    def missing(spec, config=None):
        if spec.endswith(":missing"):
            raise ModelNotFoundError(f"no such file or directory: {spec}")
        return loader(spec, config)

    with pytest.raises(ModelNotFoundError):
        _run(_raw(tmp_path, models={"pre": "tiny-llama:pre", "sft": "tiny-llama:missing"}), load=missing)
    assert not (tmp_path / "run" / "identity.json").exists()
    if not __import__("torch").cuda.is_available():
        with pytest.raises(ConfigError, match="device='cuda'"):
            _run(_raw(tmp_path, device="cuda"))
    assert not (tmp_path / "run" / "identity.json").exists()
    assert len(_run(_raw(tmp_path)).results) == 12 * 8


def test_rerun_that_adds_work_extends_the_run(tmp_path):
    small = _run(_raw(tmp_path, limit=2, schemes=[{"preset": "position", "only": ["PRE", "SFT"]}]))
    assert len(small.results) == 2 * 2 * 2
    bigger = _run(_raw(tmp_path, limit=4))
    assert bigger.computed == 4 * 2 * 8 - 8
    clean = _run(_raw(tmp_path, limit=4, out=str(tmp_path / "clean")))
    pd.testing.assert_frame_equal(bigger.results, clean.results)
    changed = [{"name": "PRE", "rules": [{"model": "sft", "layers": "0"}]}]
    with pytest.raises(ResultsDirConflict, match=r"scheme definition\(s\).*PRE"):
        _run(_raw(tmp_path, limit=4, schemes=changed))


def test_each_session_keeps_its_timing(tmp_path):
    _run(_raw(tmp_path, limit=1))
    _run(_raw(tmp_path, limit=2))
    _run(_raw(tmp_path, limit=2))
    sessions = json.loads((tmp_path / "run" / "manifest.json").read_text())["sessions"]
    assert [s["computed_this_run"] for s in sessions] == [16, 16, 0]
    assert all(s["wall_seconds"] >= 0 and s["started"] <= s["finished"] for s in sessions)
