"""Half precision (issue 14, item 4): a row's numbers do not depend on the other rows of its
batch. HF's SDPA attention rounds a padded row differently from the same row alone; runs in
bfloat16 / float16 use the eager attention, which does not."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from tiny_models import make_donor, make_tiny
from tiny_world import loader, write_world

import weightgraft as wg
from weightgraft.engine.check import check_engine
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment

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


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("sharing", [False, True])
def test_bfloat16_rows_do_not_depend_on_batch_size(tmp_path, arch, sharing):
    one = _run(tmp_path, 1, "bfloat16", arch, sharing)
    many = _run(tmp_path, 64, "bfloat16", arch, sharing)
    # exact on purpose: the drift this guards against (SDPA on a padded row) is one bfloat16 ulp of
    # the logits (0.031 at |logit| 4.2 on the tiny llama), so no tolerance tells it from rounding;
    # eager attention computes each row alike in any batch, at any thread count (run at 1 and 2)
    pd.testing.assert_frame_equal(one[COLUMNS], many[COLUMNS], check_exact=True)


def _sdpa_half(arch: str) -> list:
    """A tiny base and donor in bfloat16 with HF's SDPA attention (what from_pretrained picks)."""
    base = make_tiny(arch, seed=0)
    models = [m.to(torch.bfloat16) for m in (base, make_donor(base, 1))]
    for m in models:
        m.config._attn_implementation = "sdpa"
    return models


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@torch.no_grad()
def test_check_in_bfloat16_holds_on_padded_batches(arch):
    """``weightgraft check --dtype bfloat16`` compares a padded batch with each row alone; under
    SDPA the padding alone moved tiny llama's real-position logits by 0.04 and the check failed."""
    models = _sdpa_half(arch)
    ids = torch.randint(3, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 4:] = 0
    report = check_engine(models, ids, mask)
    assert report.passed, report.cases
    assert all(m.config._attn_implementation == "sdpa" for m in models)  # eager during the check only


@torch.no_grad()
def test_graft_api_rows_in_bfloat16_do_not_depend_on_the_batch(tiny_pair, tiny_tok):
    base, donor = tiny_pair("llama", torch.float32)
    pre, sft = (copy.deepcopy(m).to(torch.bfloat16) for m in (base, donor))
    for m in (pre, sft):
        m.config._attn_implementation = "sdpa"
    rule = wg.Rule(model="sft", positions="last", components="o")
    prompts = ["Paris is in", "Rome, the capital of Italy, lies on the river"]
    together = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts, rule).logits
    alone = torch.cat([wg.graft({"pre": pre, "sft": sft}, tiny_tok, [p], rule).logits for p in prompts])
    assert torch.equal(together, alone)  # exact on purpose: see test_bfloat16_rows_do_not_depend_on_batch_size

