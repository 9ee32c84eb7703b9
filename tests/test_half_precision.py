"""Half precision (issue 14, item 4): a row's numbers do not depend on the other rows of its
batch. HF's SDPA attention rounds a padded row differently from the same row alone; runs in
bfloat16 / float16 use the eager attention, which does not."""

from __future__ import annotations

import pandas as pd
import pytest

from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from tiny_world import loader, write_world

COLUMNS = ["rank", "prob", "answer_logprob"]


def _run(tmp_path, batch_size: int, dtype: str, arch: str, sharing: bool):
    raw = {
        "name": "half", "data": str(write_world(tmp_path / "data")), "dtype": dtype,
        "models": {"pre": f"tiny-{arch}:pre", "sft": f"tiny-{arch}:sft"}, "prefix_sharing": sharing,
        "schemes": [{"preset": "position"}], "out": str(tmp_path / f"run{batch_size}{sharing}"), "batch_size": batch_size,
    }

    def load(spec, config=None):
        lm = loader(spec, config)
        lm.model.to(getattr(__import__("torch"), dtype))
        return lm

    return run_experiment(parse_config(raw), load=load, progress=False).results


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("sharing", [False, True])
def test_bfloat16_rows_do_not_depend_on_batch_size(tmp_path, arch, sharing):
    one = _run(tmp_path, 1, "bfloat16", arch, sharing)
    many = _run(tmp_path, 64, "bfloat16", arch, sharing)
    pd.testing.assert_frame_equal(one[COLUMNS], many[COLUMNS], check_exact=True)
