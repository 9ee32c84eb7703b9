"""Atomic writes: a writer that dies mid-write leaves the old file, never half of the new one."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from weightgraft import atomic

OLD = b"old content\n" * 1000


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    """SIGKILL (no cleanup runs) while a big file is half written: the old file is whole."""
    target = tmp_path / "results.parquet"
    target.write_bytes(OLD)
    writer = textwrap.dedent(f"""
        import sys, time
        from weightgraft import atomic
        with atomic.atomic_path({str(target)!r}) as tmp, open(tmp, "wb") as fh:
            fh.write(b"new" * 1_000_000)
            fh.flush()
            print("half written", flush=True)
            time.sleep(60)  # killed here
            fh.write(b"rest")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(atomic.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"half written\n"
        halves = [p for p in tmp_path.iterdir() if p != target]
        assert len(halves) == 1 and halves[0].stat().st_size == 3_000_000  # the new bytes exist, beside the target
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == OLD
    # what the killed writer left is hidden and not named like a finished file of the folder
    assert [p.name for p in tmp_path.glob("*.parquet") if not p.name.startswith(".")] == [target.name]
    assert list(tmp_path.glob("results*")) == [target]


@pytest.mark.parametrize("how", ["disk full", "writer raises"])
def test_an_error_mid_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, how):
    target = tmp_path / "manifest.json"
    target.write_bytes(OLD)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises((OSError, RuntimeError)):
        if how == "disk full":  # the bytes are in the temporary file; making them durable fails
            monkeypatch.setattr(atomic.os, "fsync", full)
            atomic.write_json(target, {"new": "x" * 100_000})
        else:
            with atomic.atomic_path(target) as tmp:
                tmp.write_bytes(b"half")
                raise RuntimeError("boom mid-write")
    assert target.read_bytes() == OLD
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_writes_replace_the_file_whole(tmp_path):
    atomic.write_text(tmp_path / "a.txt", "één\n")
    atomic.write_json(tmp_path / "b.json", {"x": [1, 2]})
    frame = pd.DataFrame({"x": [1.5, 2.5]})
    with atomic.atomic_path(tmp_path / "c.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "één\n"
    assert (tmp_path / "b.json").read_text() == '{\n  "x": [\n    1,\n    2\n  ]\n}\n'
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "c.parquet"), frame)
    atomic.write_bytes(tmp_path / "a.txt", b"second")
    assert (tmp_path / "a.txt").read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json", "c.parquet"]


def test_figures_keep_their_format(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from weightgraft.report.figures import write_figure

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    write_figure(fig, tmp_path / "f.png")
    write_figure(fig, tmp_path / "f.svg")
    plt.close(fig)
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "f.svg").read_bytes()[:400]
