"""``wg.graft(..., cache=True)``: the grafted pass's activations by name, each equal to the
per-token definition's own activation at that position (read from its private model)."""

from __future__ import annotations

import pytest
import torch

import weightgraft as wg
from weightgraft.api.activations import activation_names, record
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import CompositeModel, per_token_forward

PROMPTS = ["The capital of France is", "Paris is in", "Rome lies on the Tiber"]
RULES = [wg.Rule(model="sft", positions="last", layers="last_half", components="o+ffn"),
         wg.Rule(model="sft", positions="0+2", components="attn")]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "gemma3_text", "phi3"])
def test_cached_activations_equal_the_definition(tiny_pair, tiny_tok, arch):
    pre, sft = tiny_pair(arch)
    models = {"pre": pre, "sft": sft}
    with float64_exact([pre, sft]):
        out = wg.graft(models, tiny_tok, PROMPTS, RULES, cache=True, full_logits=True)
        names = activation_names(pre)
        assert list(out.cache) == names and "layers.3.resid_post" in names and "layers.0.o" in names
        composite = CompositeModel([pre, sft])
        with record(composite.model, names) as seen:
            ref_logits = per_token_forward([pre, sft], out.input_ids, out.source, attention_mask=out.attention_mask,
                                           composite=composite)
    mask = out.attention_mask.bool()
    real = mask.nonzero().tolist()  # (b, t) in the order the definition ran them
    assert (out.full_logits[mask] - ref_logits[mask]).abs().max() <= 1e-10
    for name in names:
        got = out.cache[name]
        assert got.shape[:2] == out.input_ids.shape, name
        ref = torch.cat(seen[name], dim=1)[0]  # one chunk per (row, position), in that order
        mine = torch.stack([got[b, t] for b, t in real])
        assert (mine - ref).abs().max() <= 1e-10, name
    # the grafted positions really moved the activations: not the base model's own
    with record(pre, ["layers.3.o"]) as plain:
        pre(out.input_ids, attention_mask=out.attention_mask)
    last = out.attention_mask.sum(1) - 1
    rows = torch.arange(len(PROMPTS))
    assert (plain["layers.3.o"][0][rows, last] - out.cache["layers.3.o"][rows, last]).abs().max() > 1e-3


def test_cache_takes_a_list_of_names_and_refuses_unknown_ones(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, RULES, cache=["layers.1.resid_post", "layers.2.q"])
    assert set(out.cache) == {"layers.1.resid_post", "layers.2.q"}
    assert out.cache["layers.2.q"].shape[-1] == pre.config.num_attention_heads * (
        pre.config.hidden_size // pre.config.num_attention_heads)
    assert "cache=2 activations" in repr(out)
    with pytest.raises(wg.GraftInputError, match="cache names 'layers.9.o'"):
        wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, RULES, cache=["layers.9.o"])
    assert wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, RULES).cache is None
