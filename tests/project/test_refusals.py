"""Mistakes refused in one line before any model loads (issue 14, items 2, 3, 7, 8)."""

from __future__ import annotations

import json

import pytest
from tiny_world import loader, tiny_config
from typer.testing import CliRunner

from weightgraft import atomic
from weightgraft.cli.data import app as data_app
from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.schemes.selectors import SelectorError


def _raw(tmp_path, **extra) -> dict:
    return tiny_config(tmp_path, "refuse", world={"n": 2}, **{"batch_size": 8, **extra})


def _never_loads(spec, config=None):
    raise AssertionError(f"a model was loaded ({spec}) although the config is refused")


@pytest.mark.parametrize("layers", ["29..0", "1..0", "1:1", "0+1:1"])
def test_layer_selection_that_selects_nothing_is_refused(tmp_path, layers):
    raw = _raw(tmp_path, schemes=[{"name": "empty", "rules": [{"model": "sft", "layers": layers}]}])
    # refused with the config, before any model is loaded: the range is empty at any depth
    with pytest.raises(ConfigError, match=r"at schemes\.0\.rules\.0\.layers: .*selects no layer of any model") as exc:
        parse_config(raw)
    assert "preset" not in str(exc.value)  # the error speaks of the kind of entry written
    assert not (tmp_path / "run" / "identity.json").exists()


def test_layer_beyond_the_depth_is_refused_before_the_run_starts(tmp_path):
    raw = _raw(tmp_path, schemes=[{"name": "deep", "rules": [{"model": "sft", "layers": "29"}]}])
    with pytest.raises(SelectorError, match="beyond the model's depth"):
        run_experiment(parse_config(raw), load=loader, progress=False)
    assert not (tmp_path / "run" / "identity.json").exists()


def test_data_build_refuses_a_non_empty_folder_unless_forced(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ds"
    args = ["build", "--world", "real_movies_real_actors_shuffled", "--n", "6", "--out", str(out), "-q"]
    assert runner.invoke(data_app, args).exit_code == 0
    before = (out / "test_prompts.jsonl").read_bytes()
    res = runner.invoke(data_app, [*args[:-1], "--seed", "3", "-q"])
    assert res.exit_code == 2 and "is not empty; pass --force" in res.output
    assert (out / "test_prompts.jsonl").read_bytes() == before
    assert runner.invoke(data_app, [*args, "--seed", "3", "--force"]).exit_code == 0
    assert (out / "test_prompts.jsonl").read_bytes() != before
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    res = runner.invoke(data_app, ["build", "--out", str(a_file)])
    assert res.exit_code == 2 and "is a file" in res.output and "Traceback" not in res.output
    meta = tmp_path / "meta.jsonl"
    meta.write_text(json.dumps({"first_actor": "A", "second_actor": "B"}) + "\n")
    res = runner.invoke(data_app, ["build", "--metadata", str(meta), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "--metadata needs --templates" in res.output


@pytest.mark.parametrize(("change", "message"), [
    ({"schemes": [{"name": "t", "rules": [{"model": "sft", "positions": "first_entitty"}]}]},
     r"position name\(s\) \['first_entitty'\] are neither built in"),
    ({"models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft", "stf": "tiny-llama:sft"}},
     r"model role\(s\) \['stf'\] .* used by no scheme"),
    ({"device": "cuda:0"}, r"device='cuda:0'"),
])
def test_mistakes_are_refused_before_any_model_loads(tmp_path, change, message):
    if change.get("device") and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=message):
        run_experiment(parse_config(_raw(tmp_path, **change)), load=_never_loads, progress=False)
    assert not (tmp_path / "run").exists()


def test_empty_test_prompts_file_is_named(tmp_path):
    data = tmp_path / "empty"
    data.mkdir()
    (data / "test_prompts.jsonl").write_text("")
    with pytest.raises(ValueError, match="test_prompts.jsonl holds no test prompt"):
        run_experiment(parse_config(_raw(tmp_path, data=str(data), templates=["headline"])),
                       load=_never_loads, progress=False)


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    """Disk full, a missing CUDA build and friends: one line on stderr, no traceback."""
    import subprocess
    import sys

    import yaml

    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(_raw(tmp_path, device="cuda")))
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, "-m", "weightgraft", "run", str(cfg), "--no-progress"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "device='cuda'" in proc.stderr


def test_disk_full_is_one_line(tmp_path, monkeypatch, capsys, world_model_dirs):
    import errno
    import sys

    import yaml

    from weightgraft.cli import main

    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(_raw(tmp_path, models=world_model_dirs, batch_size=2)))
    calls = {"n": 0}
    real = atomic.os.fsync

    def full(fd):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", full)
    monkeypatch.setattr(sys, "argv", ["weightgraft", "run", str(cfg), "--no-progress"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the disk is full" in err and "re-running the same command resumes" in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_says_how_many_rows_are_saved_and_that_the_command_resumes(tmp_path, world_model_dirs):
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    cfg = tmp_path / "exp.yaml"
    # a larger world than _raw's, so the run is still going when the third part is saved
    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path, "refuse", world={"n": 6},
                                              models=world_model_dirs, batch_size=1)))
    # SIGINT back to its default in the child: a test run started in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt (the run finished with exit code 0)
    proc = subprocess.Popen([sys.executable, "-m", "weightgraft", "run", str(cfg), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    parts = tmp_path / "run" / "parts"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if parts.exists() and len(list(parts.glob("part-*.parquet"))) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = " ".join(err.split())
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert "row(s) are saved" in err and "the same command resumes" in err
    saved = int(err.split("interrupted: ")[1].split(" row(s)")[0])
    assert saved >= 3


def test_ctrl_c_during_a_part_write_finishes_the_part_first(tmp_path, monkeypatch):
    import os
    import signal

    from weightgraft.resume.parts import write_atomic

    real_fsync = os.fsync

    def fsync_then_ctrl_c(fd):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the part is being written
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync_then_ctrl_c)
    path = tmp_path / "part-000000.parquet"
    # Ctrl-C as in a terminal: a test run started in the background of a non-interactive
    # shell inherits SIGINT ignored
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_atomic(path, b"x" * 1_000_000)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert path.read_bytes() == b"x" * 1_000_000  # the whole part, then the interrupt
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
