"""The CLI prints what concerns the user's work: with torchao installed (the test and quant
extras), transformers imports it with its quantizers, and torchao and torch then log lines about
CUDA kernels a CPU build lacks; the entry quiets those loggers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_world import write_world


def test_a_plan_prints_no_line_from_optional_quantization_packages(tmp_path: Path,
                                                                     tiny_model_dirs: dict[str, Path]) -> None:
    pytest.importorskip("torchao")  # without it there is nothing to quiet
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps({
        "name": "quiet", "data": str(write_world(tmp_path / "data")), "out": str(tmp_path / "run"),
        "models": {"pre": str(tiny_model_dirs["pre"]), "sft": str(tiny_model_dirs["sft"])},
        "schemes": [{"preset": "position"}], "report": False}))
    out = subprocess.run([sys.executable, "-m", "weightgraft", "plan", str(config), "--no-time"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    noise = [line for line in (out.stdout + out.stderr).splitlines()
             if "torchao" in line or "_pytree" in line or "Failed to load" in line]
    assert not noise, noise
