"""Thread defaults at the command's entry (issue 14, item 10): passive OpenMP waits and a
thread per core, unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # `make check` leaves these out: a fresh interpreter per check, each over 1 s

PROBE = "import os, torch; from weightgraft.runtime import apply_thread_default; " \
        "apply_thread_default(); print(os.environ.get('OMP_WAIT_POLICY'), torch.get_num_threads())"


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "WEIGHTGRAFT_THREADS")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True,
                          text=True, check=True).stdout.split()


def test_user_thread_settings_win_and_the_default_is_bounded():
    from weightgraft.runtime import default_threads

    assert 1 <= default_threads() <= len(os.sched_getaffinity(0))
    assert _run(PROBE, OMP_NUM_THREADS="1")[1] == "1"
    assert _run(PROBE, WEIGHTGRAFT_THREADS="1", OMP_NUM_THREADS="2")[1] == "1"
    assert 1 <= int(_run(PROBE)[1]) <= len(os.sched_getaffinity(0))  # the load decides within this


def test_entry_sets_passive_waits_before_torch_loads():
    code = ("import sys; sys.argv = ['weightgraft', '--help']; import weightgraft.entry as e\n"
            "try:\n    e.main()\nexcept SystemExit:\n    pass\n"
            "import os; print(os.environ['OMP_WAIT_POLICY'])")
    assert _run(code)[-1] == "PASSIVE"
    assert _run(code, OMP_WAIT_POLICY="ACTIVE")[-1] == "ACTIVE"
