"""Grafted generation equals the per-token definition run on the same tokens, and HF
``generate`` of the base (no rules) or of the donor (every slot from it)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_CONFIGS, tiny_models, tiny_tokenizer

from weightgraft.api.generate import generate
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.forward import slots
from weightgraft.engine.generate import generate_one
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.schemes.scheme import Rule, Scheme, compile_scheme

PROMPT = "The Eiffel Tower is in"
SPANS = {"subject": "Eiffel Tower"}
RULES = [  # subject tokens, the last token (and so every new token) and one layer's FFN
    Rule(model="sft", positions="first_entity+last", layers="-1", components="attn"),
    Rule(model="sft", positions="0", layers="0", components="ffn"),
]


def _compiled(base, scheme: Scheme):
    heads = {s.name: s.heads for s in model_slots(base) if s.heads}
    return compile_scheme(scheme, slots(base), {"pre": 0, "sft": 1}, heads)


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_generation_equals_per_token_definition(arch):
    tok = tiny_tokenizer()
    base, donor = tiny_models(arch, 2, torch.float64, vocab_size=len(tok))
    rules = RULES if arch != "nemotron_h" else [  # one sublayer a block: the last block is Mamba2, graft its mixer
        Rule(model="sft", positions="first_entity+last", layers="-1", components="mixer"), RULES[1]]
    scheme = Scheme(name="graft", rules=rules)
    with float64_exact([base, donor]):
        out = generate_one([base, donor], tok, PROMPT, compiled=_compiled(base, scheme), spans=SPANS,
                           max_new_tokens=6, stop_at_eos=False)
    assert len(out.token_ids) == 6
    prompt_ids = tok(PROMPT)["input_ids"]
    ids = torch.tensor([prompt_ids + out.token_ids[:-1]])
    source = torch.cat([out.prompt_source, out.new_source])[None]
    # the source map really mixes models, and new tokens take the last position's weights
    assert source.unique().tolist() == [0, 1]
    assert torch.equal(out.new_source, out.prompt_source[-1:].expand_as(out.new_source))
    with float64_exact([base, donor]):
        ref = per_token_forward([base, donor], ids, source)[0, len(prompt_ids) - 1 :]
    assert (out.logits - ref).abs().max().item() <= 1e-12
    assert out.token_ids == ref.argmax(-1).tolist()


def test_last_token_rules_follow_the_new_token():
    """A rule on position -1 (the last) moves with generation; one on position 1 stays put."""
    tok = tiny_tokenizer()
    base, donor = tiny_models("llama", 2, torch.float64, vocab_size=len(tok))
    scheme = Scheme(name="s", rules=[Rule(model="sft", positions="1+-1", components="body")])
    out = generate_one([base, donor], tok, PROMPT, compiled=_compiled(base, scheme), max_new_tokens=4,
                       stop_at_eos=False)
    n = len(tok(PROMPT)["input_ids"])
    src = torch.cat([out.prompt_source, out.new_source])
    body = slots(base).index("layers.0.q")
    grafted = (src[:, body] == 1).nonzero().flatten().tolist()
    assert grafted == [1, n - 1, *range(n, n + 3)]
    ref = per_token_forward([base, donor], torch.tensor([tok(PROMPT)["input_ids"] + out.token_ids[:-1]]), src[None])
    torch.testing.assert_close(out.logits, ref[0, n - 1 :], rtol=1e-9, atol=1e-9)


def test_per_head_rules_generate_exactly():
    tok = tiny_tokenizer()
    base, donor = tiny_models("qwen2", 2, torch.float64, vocab_size=len(tok))
    scheme = Scheme(name="h", rules=[Rule(model="sft", positions="last", components="q+o", heads="0,2")])
    out = generate_one([base, donor], tok, PROMPT, compiled=_compiled(base, scheme), max_new_tokens=4, stop_at_eos=False)
    n = len(tok(PROMPT)["input_ids"])
    ids = torch.tensor([tok(PROMPT)["input_ids"] + out.token_ids[:-1]])
    src = torch.cat([out.prompt_source, out.new_source])[None]
    heads = {k: torch.cat([v, out.new_heads[k]])[None] for k, v in out.prompt_heads.items()}
    assert heads and all(int(h.max()) == 1 for h in heads.values())
    ref = per_token_forward([base, donor], ids, SourceMap(src, heads))
    torch.testing.assert_close(out.logits, ref[0, n - 1 :], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2", "phi3"])
def test_no_rules_is_base_generate_and_all_donor_is_donor_generate(arch):
    tok = tiny_tokenizer()
    base, donor = tiny_models(arch, 2, torch.float64, vocab_size=len(tok))
    prompts = [PROMPT, "Paris is the capital of"]
    every = Scheme(name="donor", base="sft")
    for model, scheme in ((base, None), (donor, every)):
        ours = generate({"pre": base, "sft": donor}, tok, prompts, scheme, max_new_tokens=8)
        for prompt, text in zip(prompts, ours):
            ids = torch.tensor([tok(prompt)["input_ids"]])
            hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            assert text == tok.decode(hf[0, ids.shape[1] :], skip_special_tokens=True)


def test_sampling_is_seeded_and_inputs_are_checked():
    tok = tiny_tokenizer()
    base, donor = tiny_models("llama", 2, torch.float64, vocab_size=len(tok))
    a = generate([base, donor], tok, PROMPT, RULES, max_new_tokens=8, do_sample=True, spans=SPANS, seed=3)
    b = generate([base, donor], tok, PROMPT, RULES, max_new_tokens=8, do_sample=True, spans=SPANS, seed=3)
    assert a == b
    with pytest.raises(ValueError, match="does not occur"):
        generate([base, donor], tok, PROMPT, RULES, max_new_tokens=4, spans={"subject": "Louvre"})
    with pytest.raises(ValueError, match="mapping role"):
        generate([base, donor, donor], tok, PROMPT, None, max_new_tokens=4)


def test_generate_command(tiny_model_dirs, tiny_tok):
    from typer.testing import CliRunner

    from weightgraft.cli import app
    from weightgraft.models import load_model
    from weightgraft.models.derived import lowrank_model

    tok, dirs = tiny_tok, tiny_model_dirs
    pre, sft = (load_model(dirs[n]).model for n in ("pre", "sft"))
    rule = "model=sft,positions=first_entity+last,layers=-1,components=attn"
    args = ["generate", PROMPT, "-m", f"pre={dirs['pre']}", "-m", f"sft={dirs['sft']}",
            "-s", "subject=Eiffel Tower", "-r", rule, "-n", "5"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    expected = generate([pre, sft], tok, PROMPT, [RULES[0]], max_new_tokens=5, spans=SPANS)
    assert out.stdout.strip().splitlines()[-1] == f"graft: {PROMPT}{expected}"
    # a low-rank role given on the command line
    low = ["generate", PROMPT, "-m", f"pre={dirs['pre']}", "-m", f"full={dirs['sft']}",
           "-m", "sft=lowrank(full, k=2)", "-r", "model=sft,positions=last", "-n", "4"]
    out = CliRunner().invoke(app, low)
    assert out.exit_code == 0, out.output
    lr = lowrank_model(pre, sft, 2)
    expected = generate([pre, lr], tok, PROMPT, [Rule(model="sft", positions="last")], max_new_tokens=4)
    assert out.stdout.strip().splitlines()[-1] == f"graft: {PROMPT}{expected}"
    bad = CliRunner().invoke(app, args[:-4] + ["-s", "subject=Louvre"])
    assert bad.exit_code != 0


def test_front_door_generate_is_the_grafted_generation():
    import weightgraft as wg

    tok = tiny_tokenizer()
    base, donor = tiny_models("llama", 2, torch.float64, vocab_size=len(tok))
    models = {"pre": base, "sft": donor}
    assert wg.generate is generate
    assert wg.generate(models, tok, PROMPT, RULES, max_new_tokens=4, spans=SPANS) == generate(
        models, tok, PROMPT, RULES, max_new_tokens=4, spans=SPANS)


def test_front_door_localize_is_the_localize_run():
    import weightgraft as wg
    from weightgraft.api.localize import localize

    assert wg.localize is localize


def test_generate_command_refuses_a_missing_span_before_loading(monkeypatch):
    from typer.testing import CliRunner

    from weightgraft.cli import app

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("weightgraft.models.loading.read_location", never)
    monkeypatch.setattr("weightgraft.models.loading.read_embedded", never)
    out = CliRunner().invoke(app, ["generate", PROMPT, "-m", "pre=a", "-m", "sft=b",
                                   "-r", "model=sft,positions=first_entity+last"])
    assert out.exit_code == 2 and "first_entity (any entity span)" in out.output
    assert "Traceback" not in out.output and "AssertionError" not in out.output
    out = CliRunner().invoke(app, ["generate", PROMPT, "-m", "pre=a", "-m", "sft=b",
                                   "-r", "model=sft,positions=city", "-s", "subject=Louvre"])
    assert out.exit_code == 2 and "'Louvre' does not occur" in " ".join(out.output.split())
    # a text that occurs twice is refused naming both places; the (start, end) form picks one
    twice = "Paris is the capital; Paris lies on the"
    out = CliRunner().invoke(app, ["generate", twice, "-m", "pre=a", "-m", "sft=b",
                                   "-r", "model=sft,positions=city", "-s", "city=Paris"])
    assert out.exit_code == 2 and "(0, 5), (22, 27)" in " ".join(out.output.split())
    out = CliRunner().invoke(app, ["generate", twice, "-m", "pre=a", "-m", "sft=b",
                                   "-r", "model=sft,positions=city", "-s", "city=(22, 27)"])
    assert "AssertionError" in repr(out.exception)  # past the span checks: it went on to load a model


def test_generate_with_base_none_and_a_span_the_prompt_lacks_is_one_error():
    import weightgraft as wg

    tok = tiny_tokenizer()
    base, donor = tiny_models("llama", 2, torch.float64, vocab_size=len(tok))
    models = {"pre": base, "sft": donor}
    assert wg.generate(models, tok, PROMPT, RULES, max_new_tokens=3, spans=SPANS, base=None) == generate(
        models, tok, PROMPT, RULES, max_new_tokens=3, spans=SPANS, base="pre")
    with pytest.raises(wg.GraftInputError, match="prompt 0 .*span 'city' is not marked"):
        wg.generate(models, tok, PROMPT, Rule(model="sft", positions="city"), max_new_tokens=2, spans=SPANS)


def test_one_prompt_takes_its_spans_as_a_mapping_or_a_list_of_one():
    import weightgraft as wg

    tok = tiny_tokenizer()
    base, donor = tiny_models("llama", 2, torch.float64, vocab_size=len(tok))
    models = {"pre": base, "sft": donor}
    want = wg.generate(models, tok, PROMPT, RULES, max_new_tokens=3, spans=SPANS)
    assert wg.generate(models, tok, PROMPT, RULES, max_new_tokens=3, spans=[SPANS]) == want
    with pytest.raises(wg.GraftInputError, match="one prompt takes one mapping of spans; got a list of 2"):
        wg.generate(models, tok, PROMPT, RULES, max_new_tokens=3, spans=[SPANS, SPANS])
