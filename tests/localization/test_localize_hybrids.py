"""localize on hybrids (LFM2, Qwen3.5) and on gpt-oss's attention sinks. Partial grafts are refused
on a recurrent mixer, so localize runs there with ``estimates: false``: its claims and exact maps
(whole grafts) run end to end on a tiny pair; with estimates on, the refusal is one line naming
that setting, before any model loads. A slot's parameters are the tensors it owns (``sinks``: one
logit per head, not the attention module; ``mixer_decay``: ``A_log`` and ``dt_bias``, not the
mixer), so the claims' parameter-matched thresholds weigh the mixer slots by their own size."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from tiny_models import HYBRID_CONFIGS, make_tiny, tiny_tokenizer
from tiny_world import loader, write_world

from weightgraft.api.localize import localize
from weightgraft.engine.architectures import model_slots
from weightgraft.errors import GraftArgumentTypeError
from weightgraft.localization.claims import VERDICTS
from weightgraft.localization.claims.grafts import ClaimMap, judge_claims
from weightgraft.localization.claims.regions import Claim
from weightgraft.localization.claims.stage import slot_params
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.plan_input import plan_input
from weightgraft.planning.localize import plan_localize_work

READ_ESTIMATES = ["share_estimate", "interaction"]


def _raw(tmp_path, arch: str, **extra) -> dict:
    return {"name": "loc", "data": str(write_world(tmp_path / "data", n=3)),
            "models": {"pre": f"tiny-{arch}:pre", "sft": f"tiny-{arch}:sft"}, "out": str(tmp_path / "runs"),
            "exact_chunk": 64, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99},
            "search": {"enabled": False}, **extra}


@pytest.mark.parametrize("arch", ["lfm2", "qwen3_5_text"])
def test_a_hybrid_pair_judges_its_claims_without_estimates(tmp_path, arch):
    result = localize(_raw(tmp_path, arch, exact=1, estimates=False, graft_directions=["sufficiency"]),
                      progress=False, load=loader)
    claims = pd.read_csv(result.run_dir / "claims.csv", keep_default_na=False, na_values=[""])
    assert len(claims) and set(claims["verdict"]) <= set(VERDICTS)
    positions = claims[claims["claim"].isin(["fe_lt", "enrichment", "recall", "recall_no_unembed"])]
    assert len(positions) and positions["share_exact"].notna().all() and (positions["null_drawn"] != "none").all()
    assert claims[READ_ESTIMATES].isna().all().all()
    cells = pd.read_parquet(result.run_dir / "cells.parquet")
    assert {"layers.0.mixer_conv", "layers.0.mixer_out", "layers.1.o"} <= set(cells["slot"])
    assert cells["estimate"].isna().all() and cells["exact"].notna().any()
    mixed = cells[cells["slot"].str.contains("mixer_") & cells["exact"].notna()]
    assert len(mixed) and (mixed["exact"].abs() > 0).any()  # the mixers' cells were grafted exactly


def test_estimates_on_a_hybrid_are_refused_in_one_line_naming_the_setting(tmp_path, monkeypatch):
    config = copy.deepcopy(HYBRID_CONFIGS["qwen3_5_text"])
    config.vocab_size = 200
    config.save_pretrained(tmp_path / "hybrid")
    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    spec = f"random:{tmp_path / 'hybrid' / 'config.json'}"
    raw = {**_raw(tmp_path, "qwen3_5_text"), "models": {"pre": spec, "sft": spec + "@1"}, "tokenizer": str(tmp_path / "tok")}
    monkeypatch.setattr("weightgraft.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(GraftArgumentTypeError, match="recurrent token mixer") as err:  # estimates on: the default
        localize(raw, progress=False)
    assert "set estimates: false" in str(err.value) and "\n" not in str(err.value)
    plan = plan_localize_work(plan_input(parse_localize_config({**raw, "estimates": False})), with_time=False)
    assert plan.fits and "graft deltas" not in plan.memory


def test_a_slots_parameters_are_the_tensors_it_owns():
    oss = make_tiny("gpt_oss")
    params = slot_params(oss)
    heads = oss.config.num_attention_heads
    assert params["layers.0.sinks"] == heads == oss.model.layers[0].self_attn.sinks.numel()
    for arch in ("qwen3_5_text", "nemotron_h", "lfm2"):
        model = make_tiny(arch)
        params = slot_params(model)
        mixer = next(s.mixer.path for s in model_slots(model) if s.mixer is not None)
        module = model.get_submodule(mixer)
        if hasattr(module, "A_log"):
            assert params["layers.0.mixer_decay"] == module.A_log.numel() + module.dt_bias.numel()
        if hasattr(module, "D"):
            assert params["layers.0.mixer_skip"] == module.D.numel()
        tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
        total = sum(p.numel() for p in model.parameters()) + (model.get_input_embeddings().weight.numel() if tied else 0)
        assert sum(params.values()) == total, arch  # every parameter counted once (a tied matrix in both its slots)
    moe = make_tiny("mixtral")  # no tensors part: every slot its module's parameters, as before
    assert sum(slot_params(moe).values()) == sum(p.numel() for p in moe.parameters())


def test_parameter_matched_thresholds_on_a_hybrid_use_the_mixer_slots_own_sizes():
    model = make_tiny("qwen3_5_text")
    params = slot_params(model)
    layer = [s.name for s in model_slots(model) if s.name.startswith("layers.2.")]
    keys = [("last", s) for s in layer]
    region = ("mixer_decay", "mixer_out")
    claim = Claim("decay_out", "the decay and out_proj carry more than their share", lambda c, n: c["component"].isin(region),
                  lambda c, n: c["slot"].str.startswith("layers.2."), 0.0, "components")
    data = ClaimMap([set(keys)] * 4, [{}] * 4, lambda sets: np.random.default_rng(0).uniform(1, 2, (4, len(sets))),
                    params, n_layers=3)
    (row,), _ = judge_claims(data, "hybrid", claims=[claim], draws=3, n_resamples=99)
    attn = model.model.layers[2].linear_attn
    own = attn.A_log.numel() + attn.dt_bias.numel() + attn.out_proj.weight.numel()
    share = own / sum(p.numel() for p in model.model.layers[2].parameters())
    assert row["region_params_share"] == pytest.approx(share) and row["threshold"] == pytest.approx(share)
    whole = sum(p.numel() for p in attn.parameters())  # the mixer module: what the decay slot would count as a module
    assert params["layers.2.mixer_decay"] * 10 < whole and "other components" in row["null_drawn"]
