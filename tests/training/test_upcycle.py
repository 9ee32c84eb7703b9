"""Sparse upcycling: the MoE computes the dense model's function at initialisation, loads with
plain AutoModelForCausalLM, grafts exactly, and what it cannot serve is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from tiny_models import make_donor, make_tiny, random_ids
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli import app
from weightgraft.engine.reference import per_token_forward
from weightgraft.training.upcycle import UpcycleError, Upcycling, check_upcyclable, upcycle


def _dense(tied: bool = True) -> torch.nn.Module:
    return make_tiny("llama", seed=0, tied=tied).double()


@pytest.mark.parametrize("tied", [True, False])
@torch.no_grad()
def test_the_upcycled_model_computes_the_dense_function(tied):
    dense = _dense(tied)
    moe = upcycle(dense, Upcycling(experts=4, top_k=2, seed=0))
    moe.set_experts_implementation("eager")
    ids = random_ids(2, 9)
    scale = dense(input_ids=ids).logits.abs().max().item()
    # the routing weights are renormalised in float32 by the router: equal within that rounding
    assert (moe(input_ids=ids).logits - dense(input_ids=ids).logits).abs().max().item() < 1e-6 * scale
    assert moe.config.model_type == "mixtral" and moe.config.tie_word_embeddings == tied
    assert (moe.lm_head.weight is moe.model.embed_tokens.weight) == tied
    # the null: an upcycled model whose experts are not all the dense MLP is another function
    moe.model.layers[1].mlp.experts.down_proj[0].mul_(0.5)
    assert (moe(input_ids=ids).logits - dense(input_ids=ids).logits).abs().max().item() > 1e-3


def test_the_router_is_seeded():
    dense = _dense()
    a, b, c = (upcycle(dense, Upcycling(seed=s)).model.layers[0].mlp.gate.weight for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.std().item() == pytest.approx(dense.config.initializer_range, rel=0.5)


@torch.no_grad()
def test_an_upcycled_pair_grafts_as_the_per_token_definition():
    pre = upcycle(_dense(), Upcycling(experts=4, top_k=2))
    pre.set_experts_implementation("eager")
    sft = make_donor(pre, 1)
    ids = random_ids(2, 8)
    source = torch.randint(0, 2, (*ids.shape, len(wg.slots(pre))), generator=torch.Generator().manual_seed(0))
    engine = wg.graft_forward([pre, sft], ids, source)
    assert (engine - per_token_forward([pre, sft], ids, source)).abs().max().item() < 1e-10


def test_what_cannot_be_upcycled_is_refused_in_one_line():
    with pytest.raises(UpcycleError, match="not upcycled"):
        check_upcyclable(T.Qwen2Config())
    with pytest.raises(UpcycleError, match="attention_bias"):
        check_upcyclable(T.LlamaConfig(attention_bias=True))
    with pytest.raises(UpcycleError, match="router never learns"):
        Upcycling(experts=4, top_k=1)
    with pytest.raises(UpcycleError, match="at least 2 experts"):
        Upcycling(experts=1, top_k=1)


def test_the_command_writes_a_folder_auto_loads(tmp_path, tiny_model_dirs):
    out = tmp_path / "moe"
    result = CliRunner().invoke(app, ["upcycle", "--model", str(tiny_model_dirs["pre"]), "--out", str(out),
                                      "--experts", "3", "--top-k", "2", "--seed", "7"])
    assert result.exit_code == 0, result.output
    moe = T.AutoModelForCausalLM.from_pretrained(out)
    assert type(moe).__name__ == "MixtralForCausalLM" and moe.config.num_local_experts == 3
    record = json.loads((out / "upcycle.json").read_text())
    assert record["seed"] == 7 and len(record["dense_sha256"]) == 64
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
    again = CliRunner().invoke(app, ["upcycle", "--model", str(tiny_model_dirs["pre"]), "--out", str(out)])
    assert again.exit_code != 0 and "not empty" in str(again.exception)
