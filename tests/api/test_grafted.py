"""``with wg.grafted(models, tok, rules) as model``: the base HF model runs grafted for any input;
its forward, HF ``generate`` and forward hooks equal ``wg.graft`` / ``wg.generate``."""

from __future__ import annotations

import pytest
import torch

import weightgraft as wg

PROMPTS = ["The capital of France is", "Paris is in", "Rome lies on the Tiber"]
SPANS = {"city": "Paris"}


def _rules():
    return [wg.Rule(model="sft", positions="last", layers="last_half", components="o+ffn"),
            wg.Rule(model="sft", positions="0", components="attn")]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3"])
def test_forward_equals_wg_graft(tiny_pair, tiny_tok, arch):
    pre, sft = tiny_pair(arch)
    models = {"pre": pre, "sft": sft}
    want = wg.graft(models, tiny_tok, PROMPTS, _rules(), full_logits=True)
    with torch.no_grad(), wg.grafted(models, tiny_tok, _rules()) as model:
        assert model is pre
        got = model(want.input_ids, attention_mask=want.attention_mask).logits
    mask = want.attention_mask.bool()
    assert (got[mask] - want.full_logits[mask]).abs().max() <= 1e-12
    with torch.no_grad():  # itself again on exit
        plain = pre(want.input_ids, attention_mask=want.attention_mask).logits
    assert (plain[mask] - got[mask]).abs().max() > 1e-3
    assert "forward" not in pre.__dict__


def test_hf_generate_equals_wg_generate(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    models = {"pre": pre, "sft": sft}
    prompt = PROMPTS[1]
    rules = [*_rules(), wg.Rule(model="sft", positions="city", components="ffn")]
    want = wg.generate(models, tiny_tok, prompt, rules, max_new_tokens=6, spans=SPANS)
    ids = tiny_tok([prompt], return_tensors="pt")["input_ids"]
    with torch.no_grad(), wg.grafted(models, tiny_tok, rules, spans=SPANS) as model:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             pad_token_id=tiny_tok.pad_token_id)
    got = tiny_tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert got == want
    plain = wg.generate(models, tiny_tok, prompt, None, max_new_tokens=6)
    assert plain != want  # the graft changed the continuation


def test_forward_hooks_see_the_grafted_pass(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    models = {"pre": pre, "sft": sft}
    want = wg.graft(models, tiny_tok, PROMPTS, _rules(), cache=["layers.3.o", "layers.3.resid_post"])
    seen = {}
    hooks = [pre.model.layers[3].self_attn.o_proj.register_forward_hook(lambda m, a, o: seen.__setitem__("o", o)),
             pre.model.layers[3].register_forward_hook(
                 lambda m, a, o: seen.__setitem__("resid", o[0] if isinstance(o, tuple) else o))]
    try:
        with torch.no_grad(), wg.grafted(models, tiny_tok, _rules()) as model:
            model(want.input_ids, attention_mask=want.attention_mask)
    finally:
        for h in hooks:
            h.remove()
    mask = want.attention_mask.bool()
    assert (seen["o"][mask] - want.cache["layers.3.o"][mask]).abs().max() <= 1e-12
    assert (seen["resid"][mask] - want.cache["layers.3.resid_post"][mask]).abs().max() <= 1e-12


def test_a_span_the_input_lacks_is_one_error(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    ids = tiny_tok(["Rome lies on the Tiber"], return_tensors="pt")["input_ids"]
    with wg.grafted({"pre": pre, "sft": sft}, tiny_tok, wg.Rule(model="sft", positions="city"),
                    spans=SPANS) as model, pytest.raises(wg.GraftInputError, match="Paris"):
        model(ids)
    assert "forward" not in pre.__dict__


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_generates_what_each_prompt_alone_generates(tiny_pair, tiny_tok, side):
    """A right-padded batch (what ``wg.load``'s tokenizer gives) is generated left-padded
    inside ``wg.grafted``: no row continues from its padding."""
    pre, sft = tiny_pair("llama")
    models = {"pre": pre, "sft": sft}
    prompts = [PROMPTS[1], PROMPTS[2]]  # of different lengths, so one row is padded
    alone = [wg.generate(models, tiny_tok, p, _rules(), max_new_tokens=5) for p in prompts]
    assert wg.generate(models, tiny_tok, prompts, _rules(), max_new_tokens=5) == alone
    tiny_tok.padding_side = side
    try:
        enc = tiny_tok(prompts, padding=True, return_tensors="pt")
    finally:
        tiny_tok.padding_side = "right"
    assert not enc["attention_mask"].all()
    n = enc["input_ids"].shape[1]
    with torch.no_grad(), wg.grafted(models, tiny_tok, _rules()) as model:
        for out in (model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tiny_tok.pad_token_id),
                    model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=5,
                                   do_sample=False, pad_token_id=tiny_tok.pad_token_id)):
            got = [tiny_tok.decode(row[n:].tolist(), skip_special_tokens=True) for row in out]
            assert got == alone
    assert "generate" not in pre.__dict__  # itself again on exit
