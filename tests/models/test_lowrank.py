"""Low-rank donors: full rank is the donor, rank 1 is the hand-computed SVD graft, and the
engine serving a low-rank donor equals the per-token definition."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import TINY_CONFIGS, tiny_models
from tiny_world import loader, write_world

import weightgraft as wg
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.models.derived import LowRankDelta, LowRankError, lowrank_model
from weightgraft.models.spec import LowRankSpec, check_roles, parse_lowrank

ARCHS = ["gpt2", "llama", "gemma", "phi3", "qwen2", "gpt_neox"]


@pytest.mark.parametrize("arch", ARCHS)
def test_full_rank_is_the_donor_exactly(arch):
    base, donor = tiny_models(arch, 2, torch.float64)
    low = lowrank_model(base, donor, k=10_000)
    for (name, p), q in zip(low.named_parameters(), donor.parameters()):
        assert torch.equal(p, q), name


def test_rank_one_is_the_hand_computed_svd_graft():
    base, donor = tiny_models("llama", 2, torch.float64)
    low = lowrank_model(base, donor, k=1)
    d = dict(donor.named_parameters())
    for name, p in low.named_parameters():
        pre = dict(base.named_parameters())[name].detach().numpy()
        if p.dim() == 1:  # vectors come whole from the donor
            assert torch.equal(p, d[name])
            continue
        u, s, vh = np.linalg.svd(d[name].detach().numpy() - pre)
        expected = pre + s[0] * np.outer(u[:, 0], vh[0])
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=0, atol=1e-12)
        assert np.linalg.matrix_rank(p.detach().numpy() - pre, tol=1e-9) == 1
    kept = lowrank_model(base, donor, k=1, vectors="pre")
    for (name, p), q in zip(kept.named_parameters(), base.parameters()):
        if p.dim() == 1:
            assert torch.equal(p, q), name


def test_rank_error_shrinks_with_k_and_one_svd_serves_every_k():
    base, donor = tiny_models("llama", 2, torch.float64)
    delta = LowRankDelta(base, donor)
    name = "model.layers.0.mlp.down_proj.weight"
    errors = [
        (dict(delta.model(k).named_parameters())[name] - dict(donor.named_parameters())[name]).norm().item()
        for k in (1, 4, 16, 10_000)
    ]
    assert errors[0] > errors[1] > errors[2] > errors[3] == 0.0


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
@torch.no_grad()
def test_engine_with_a_low_rank_donor_equals_the_definition(arch):
    base, donor = tiny_models(arch, 2, torch.float64)
    models = [base, donor, lowrank_model(base, donor, k=2)]
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    source = torch.randint(0, 3, (2, 7, len(wg.slots(base))), generator=torch.Generator().manual_seed(1))
    with float64_exact(models):  # norms and mixers that compute in float32 inside, in float64 (Qwen3.5)
        fast = wg.graft_forward(models, ids, source)
        ref = per_token_forward(models, ids, source)
    assert (fast - ref).abs().max().item() <= 1e-9
    # and the low-rank donor is a third model, neither base nor donor
    only_low = torch.full_like(source, 2)
    with float64_exact(models):  # float64 banks run eagerly there (grouped_mm refuses float64 on a CPU)
        assert not torch.allclose(wg.graft_forward(models, ids, only_low), wg.graft_forward(models, ids, torch.ones_like(source)))


def test_specs_are_parsed_and_checked_before_loading():
    assert parse_lowrank("smollm2-135m") is None
    assert parse_lowrank("lowrank(sft, k=8)") == LowRankSpec("sft", 8)
    assert parse_lowrank("lowrank( full , k=2, base=pre, vectors=pre )") == LowRankSpec("full", 2, "pre", "pre")
    for bad in ("lowrank(sft)", "lowrank(k=3)", "lowrank(sft, k=0)", "lowrank(sft, k=2, rank=3)", "lowrank sft"):
        with pytest.raises(LowRankError):
            parse_lowrank(bad)
    with pytest.raises(LowRankError, match="'full'"):
        check_roles({"pre": "a", "sft": "lowrank(full, k=1)"}, "model set 'x'")


def test_a_sweep_over_k_is_a_config_line(tmp_path):
    """Model sets k1 / kfull: SFT rows of kfull equal the plain donor's; k1 differs."""
    sets = {
        f"k{k}": {"pre": "tiny-llama:pre", "full": "tiny-llama:sft", "sft": f"lowrank(full, k={k})"}
        for k in (1, 1000)
    }
    sets["plain"] = {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}
    raw = {
        "name": "lr", "data": str(write_world(tmp_path / "data")), "model_sets": sets,
        "schemes": [{"preset": "position", "only": ["PRE", "SFT", "LT"]}], "out": str(tmp_path / "run"),
    }
    res = run_experiment(parse_config(raw), load=loader, progress=False).results
    sft = res[res.scheme == "SFT"].set_index(["model_set", "template", "example_id"])["answer_logprob"]
    full, plain, one = (sft.xs(s, level="model_set") for s in ("k1000", "plain", "k1"))
    pd.testing.assert_series_equal(full, plain, rtol=1e-5)
    assert (one - plain).abs().max() > 1e-3
