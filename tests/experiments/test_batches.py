"""A batch that runs out of device memory is run again in halves: the rows equal a run whose
batches fitted, the split is said and counted in the manifest, and a single row that does not
fit is one line (out-of-memory is simulated on CPU: the engine's call raises CUDA's error for
batches larger than 2 rows)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from tiny_world import loader, tiny_config

from weightgraft.experiments import runner
from weightgraft.experiments.batches import OutOfMemory, in_halves
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment


def test_halves_until_each_part_fits_and_counts_the_splits():
    def run(rows):
        if len(rows) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return list(rows)

    said = []
    parts, splits = in_halves(list(range(7)), run, said.append)
    assert parts == [[0], [1, 2], [3, 4], [5, 6]] and splits == 3 and len(said) == 3
    assert "a batch of 7 rows ran out of device memory: running it as 3 + 4" in said[0]
    with pytest.raises(OutOfMemory, match="one row alone does not fit"):
        in_halves([0], lambda rows: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("x")), said.append)


@pytest.mark.slow
def test_a_run_whose_batches_run_out_of_memory_gives_the_rows_of_one_whose_batches_fit(tmp_path, monkeypatch, capsys):
    fits = run_experiment(parse_config(tiny_config(tmp_path / "a", "oom", batch_size=2)), load=loader, progress=False)
    real = runner.compute_logits

    def small_memory(models, rows, *args, **kwargs):
        if len(rows) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(models, rows, *args, **kwargs)

    monkeypatch.setattr(runner, "compute_logits", small_memory)
    split = run_experiment(parse_config(tiny_config(tmp_path / "b", "oom", batch_size=8)), load=loader, progress=False)
    keys = ["model_set", "template", "scheme", "example_id"]
    a = fits.results.sort_values(keys).reset_index(drop=True)
    b = split.results.sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=1e-6, rtol=0)
    manifest = json.loads((split.run_dir / "manifest.json").read_text())
    assert manifest["batches_split_on_oom"] > 0
    assert "ran out of device memory" in capsys.readouterr().err
