"""A sweep spread over 2 processes (torchrun, gloo on CPU) merges to the single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from tiny_world import write_world

from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment

pytestmark = pytest.mark.slow  # `make check` leaves these out: a torchrun sweep


def test_torchrun_two_processes_equal_one(tmp_path, world_model_dirs):
    raw = {
        "name": "dist", "data": str(write_world(tmp_path / "data", broken=2)),
        "models": world_model_dirs,
        "schemes": [{"preset": "position"}], "batch_size": 5, "report": False,
    }
    single = run_experiment(parse_config({**raw, "out": str(tmp_path / "one")}), progress=False)

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**raw, "out": str(tmp_path / "two")}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--standalone", "-m", "weightgraft", "run", str(path), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("FE+LT") >= 1  # rank 0 printed the summary table once

    parts = sorted(p.name for p in (tmp_path / "two" / "parts").iterdir())
    assert any(p.startswith("part-r0-") for p in parts) and any(p.startswith("part-r1-") for p in parts)
    merged = pd.read_parquet(tmp_path / "two" / "results.parquet")
    assert len(merged) == len(single.results) == 10 * 8
    assert not merged.duplicated(["model_set", "template", "scheme", "example_id"]).any()
    cols = ["template", "scheme", "example_id", "target_token_id", "rank", "top1", "top5", "prob", "answer_logprob"]
    pd.testing.assert_frame_equal(merged[cols], single.results[cols], check_exact=False, rtol=1e-5, atol=1e-7)
    # recovery = (graft - PRE) / (SFT - PRE) magnifies the rounding of ranks on 1 vs 2 threads
    two = pd.read_csv(tmp_path / "two" / "summary.csv")
    one = pd.read_csv(tmp_path / "one" / "summary.csv")  # both as CSV reads them (an all-empty note is NaN)
    derived = [c for c in two.columns if "recovery" in c]
    # fact_logprob is a difference of logits that sits near 0: compared in absolute terms (float32 logits)
    fact = [c for c in two.columns if "fact_logprob" in c]
    pd.testing.assert_frame_equal(two.drop(columns=derived + fact), one.drop(columns=derived + fact), check_exact=False,
                                  rtol=1e-5)
    pd.testing.assert_frame_equal(two[derived], one[derived], check_exact=False, rtol=1e-3, atol=1e-4)
    pd.testing.assert_frame_equal(two[fact], one[fact], check_exact=False, rtol=0, atol=1e-5)
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["processes"] == 2 and manifest["computed_this_run"] == 80

    # run again with 2 processes: everything is done, nothing is recomputed or duplicated
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "manifest.json").read_text())["computed_this_run"] == 0
    assert len(pd.read_parquet(tmp_path / "two" / "results.parquet")) == 80
