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

pytestmark = pytest.mark.slow  # `make check` leaves these out: CLI commands in a fresh interpreter, each over 1 s


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


def test_a_finetune_prints_no_line_from_bitsandbytes_kernel_search(tmp_path: Path, base_dir: Path,
                                                                   data_dir: Path) -> None:
    """A float model's finetune imports bitsandbytes (through peft): on a CPU with AVX512-BF16 it
    logs that a fused kernel package is missing and advises installing it (nothing here uses it)."""
    pytest.importorskip("bitsandbytes")
    out = subprocess.run([sys.executable, "-m", "weightgraft", "train", "--model", str(base_dir), "--data", str(data_dir),
                          "--split", "both", "--preset", "cpu-quick", "--out", str(tmp_path / "sft"), "--max-steps", "1",
                          "--seed", "0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    noise = [line for line in (out.stdout + out.stderr).splitlines()
             if "kernels" in line or "Failed to load" in line or "_pytree" in line]
    assert not noise, noise
