"""``protocol: authors``: the compiled maps are the authors' code's (which slots, layers,
positions), and the engine runs them exactly as the per-token definition does."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from tiny_models import TINY_CONFIGS, _randomize, make_donor, tiny_tokenizer

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.reference import per_token_forward
from weightgraft.experiments.config import parse_config
from weightgraft.schemes.presets import preset
from weightgraft.schemes.protocol import (
    DIFFERENCES,
    differences_markdown,
    embeddings_tied,
)
from weightgraft.schemes.scheme import Rule, Scheme, compile_scheme
from weightgraft.schemes.selectors import SelectorError, select_layers

TOL = 1e-9  # float64
PROMPT = "Al Bo in in Up by"
SPANS = {"first_actor": (0, 5), "relation": (6, 8), "relation_preposition": (6, 8),
         "movie_title": (12, 14), "preposition": (15, 17)}
LLAMA_COMPS = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


def _names(n_layers: int, comps=LLAMA_COMPS, pos_embed: bool = False) -> list[str]:
    head = ["embed", "pos_embed"] if pos_embed else ["embed"]
    return head + [f"layers.{i}.{c}" for i in range(n_layers) for c in comps] + ["final_norm", "unembed"]


@pytest.fixture(scope="module")
def offsets():
    return tiny_tokenizer()(PROMPT, return_offsets_mapping=True)["offset_mapping"]


def _compile(scheme: Scheme, names, roles=None, tied=True, protocol="authors"):
    roles = roles or {"pre": 0, "sft": 1, "task": 1, "relation": 2}
    return compile_scheme(scheme, names, roles, protocol=protocol, tied_embeddings=tied)


def _by_name(schemes, name):
    return next(s for s in schemes if s.name == name)


def _grafted_layers(src_row, names, comp, model):
    return sorted(int(n.split(".")[1]) for i, n in enumerate(names)
                  if n.endswith(f".{comp}") and src_row[i] == model)


# ------------------------------------------------------------ the maps are the spec's

@pytest.mark.parametrize("n, fourth", [(16, range(12, 16)), (18, range(12, 18)), (30, range(21, 30)), (32, range(24, 32))])
def test_quarters_are_floor_wide_with_the_remainder_in_the_fourth(n, fourth, offsets):
    assert select_layers("fourth_quarter", n, floor_quarters=True) == list(fourth)
    assert select_layers("quarter:1", n, floor_quarters=True) == list(range(n // 4))
    assert select_layers("last_half", n, floor_quarters=True) == list(range(n // 2, n))
    names = _names(n)
    comp = _compile(_by_name(preset("component", protocol="authors"), "o_ffn@fourth_quarter"), names)
    src = comp.source(offsets, SPANS)
    assert _grafted_layers(src[-1], names, "o", 1) == list(fourth)
    assert (src[:-1] == 0).all()  # the last token only


def test_paper_quarters_are_unchanged():
    assert select_layers("last_quarter", 30) == list(range(22, 30))
    assert select_layers("fourth_quarter", 18) == list(range(13, 18))


def test_component_sets_by_their_names(offsets):
    names = _names(18)
    schemes = preset("component", protocol="authors")
    expected = {
        "attn_ffn": {"q", "k", "v", "gate", "up", "down"}, "attn_o": {"q", "k", "v", "o"},
        "attn_o_ffn": {"q", "k", "v", "o", "gate", "up", "down"}, "o": {"o"},
        "o_ffn": {"o", "gate", "up", "down"}, "o_ffn_up": {"o", "up"}, "o_ffn_down": {"o", "down"},
        "ffn": {"gate", "up", "down"},
    }
    for cname, comps in expected.items():
        src = _compile(_by_name(schemes, f"{cname}@fourth_quarter"), names).source(offsets, SPANS)
        got = {n.rsplit(".", 1)[1] for i, n in enumerate(names) if src[-1, i] == 1}
        assert got == comps, cname  # no embedding, no norms, so the unembedding stays the base's


@pytest.mark.parametrize("tied", [True, False])
def test_unembedding_follows_the_embedding_on_tied_models_only(tied, offsets):
    names = _names(4)
    u, fn, e = names.index("unembed"), names.index("final_norm"), names.index("embed")
    schemes = preset("position", protocol="authors")
    for name, donor_at_last in [("LT", True), ("FE+LT", True), ("FE^C", True), ("FE", False),
                                ("(FE+LT)^C", False), ("LT^C", False)]:
        src = _compile(_by_name(schemes, name), names, tied=tied).source(offsets, SPANS)
        assert src[-1, u].item() == int(tied and donor_at_last), name
        assert (src[:, u] == src[:, e]).all() if tied else (src[:, u] == 0).all()
        assert (src[:, fn] == 0).all()  # never the final norm
    paper = compile_scheme(_by_name(preset("position"), "LT"), names, {"pre": 0, "sft": 1}, tied_embeddings=True)
    src = paper.source(offsets, SPANS)
    assert src[-1, u] == 0 and src[-1, fn] == 1


def test_complement_positions_get_everything_but_the_down_projection(offsets):
    names = _names(4)
    schemes = preset("position", protocol="authors")
    src = _compile(_by_name(schemes, "(FE+LT)^C"), names).source(offsets, SPANS)
    middle = src[7]  # inside "in in", neither the first entity nor the last token
    assert _grafted_layers(middle, names, "down", 1) == []
    assert _grafted_layers(middle, names, "up", 1) == [0, 1, 2, 3]
    assert middle[names.index("embed")] == 1 and (src[:5] == 0).all() and (src[-1] == 0).all()
    lt_c = _compile(_by_name(schemes, "LT^C"), names).source(offsets, SPANS)
    assert _grafted_layers(lt_c[0], names, "down", 1) == [0, 1, 2, 3]  # FE in full
    assert _grafted_layers(lt_c[7], names, "down", 1) == []


def test_gpt2_embed_is_wte_only_under_authors(offsets):
    names = _names(4, comps=("attn_norm", "q", "k", "v", "o", "mlp_norm", "up", "down"), pos_embed=True)
    p = names.index("pos_embed")
    authors = _compile(_by_name(preset("position", protocol="authors"), "LT"), names).source(offsets, SPANS)
    paper = compile_scheme(_by_name(preset("position"), "LT"), names, {"pre": 0, "sft": 1}).source(offsets, SPANS)
    assert authors[-1, p] == 0 and authors[-1, names.index("embed")] == 1
    assert paper[-1, p] == 1


def test_hybrid_last_token_sources(offsets):
    names = _names(18)
    scheme = _by_name(preset("hybrid", protocol="authors"), "FE:none")
    src = _compile(scheme, names, {"pre": 0, "task": 1, "relation": 2}).source(offsets, SPANS)
    last = src[-1]
    for comp in ("q", "k", "v", "gate"):
        assert _grafted_layers(last, names, comp, 1) == list(range(8, 18))
    for comp in ("o", "up", "down"):
        assert _grafted_layers(last, names, comp, 2) == list(range(9, 18))
        assert _grafted_layers(last, names, comp, 1) == [8]
    assert _grafted_layers(last, names, "attn_norm", 0) == list(range(18))
    assert last[names.index("unembed")] == 0 and (src[:-1] == 0).all()


def test_layer_dropout_is_redrawn_per_token_and_seeded(offsets):
    names = _names(10)
    schemes = preset("layer_dropout", protocol="authors", seeds=(0, 1))
    scheme = _by_name(schemes, "dropout0.4#0")
    src = _compile(scheme, names).source(offsets, SPANS)
    rows = [0, 1, 2, 3, 4, len(offsets) - 1]  # first entity and last token
    kept = [tuple(_grafted_layers(src[t], names, "q", 1)) for t in rows]
    assert all(len(k) == 6 for k in kept)  # int(0.4 * 10) = 4 layers dropped per token
    assert len(set(kept)) > 1  # re-drawn per token
    for t in rows:  # whole layers: every component of a kept layer, none of a dropped one
        assert _grafted_layers(src[t], names, "down", 1) == list(kept[rows.index(t)])
    assert torch.equal(src, _compile(scheme, names).source(offsets, SPANS))
    other = _compile(_by_name(schemes, "dropout0.4#1"), names).source(offsets, SPANS)
    assert not torch.equal(src, other)
    all_dropped = _compile(_by_name(schemes, "dropout1#0"), names).source(offsets, SPANS)
    assert _grafted_layers(all_dropped[-1], names, "q", 1) == []
    assert all_dropped[-1, names.index("embed")] == 1  # the embedding is still grafted


def test_embedding_without_layers_is_refused_under_authors():
    scheme = Scheme(name="e", rules=[Rule(model="sft", positions="last", components="embed")])
    with pytest.raises(SelectorError, match="needs layers"):
        _compile(scheme, _names(4))
    compile_scheme(scheme, _names(4), {"pre": 0, "sft": 1})  # fine under paper


def test_protocol_key_in_config(tmp_path):
    raw = {"data": str(tmp_path), "models": {"pre": "a", "sft": "b"}, "schemes": [{"preset": "component"}]}
    paper = parse_config(raw)
    authors = parse_config({**raw, "protocol": "authors"})
    assert [s.name for s in authors.resolved_schemes()][2] == "attn_ffn@fourth_quarter"
    assert [s.name for s in paper.resolved_schemes()][2] == "ATTN+O+FFN@all"
    assert paper.identity() != authors.identity()
    with pytest.raises(ValueError, match="protocol"):
        parse_config({**raw, "protocol": "nope"})
    assert len(DIFFERENCES) >= 8 and "final norm" in differences_markdown()


# ------------------------------------------------------------ exact against the definition

CASES = [("llama", False), ("llama", True), ("gemma", True), ("gpt2", True), ("gpt_neox", False)]


def _deep_model(model_type: str, tied: bool, seed: int) -> torch.nn.Module:
    config = copy.deepcopy(TINY_CONFIGS[model_type])
    config.num_hidden_layers = 5  # quarters 1,1,1,2: the remainder goes to the fourth
    config.tie_word_embeddings = tied
    model = T.AutoModelForCausalLM.from_config(config)
    _randomize(model, torch.Generator().manual_seed(seed))
    return model.double().eval()


@pytest.mark.slow
@pytest.mark.parametrize("model_type, tied", CASES)
@torch.no_grad()
def test_authors_maps_through_the_engine_equal_the_per_token_definition(model_type, tied, offsets):
    base = _deep_model(model_type, tied, 0)
    assert embeddings_tied(base) == tied
    models = [base, make_donor(base, seed=1), make_donor(base, seed=2)]
    names = wg.slots(base)
    heads = {s.name: s.heads for s in model_slots(base) if s.heads}
    ids = torch.tensor([tiny_tokenizer()(PROMPT)["input_ids"]])
    ids = ids % base.config.vocab_size
    schemes = (preset("position", protocol="authors", spans=True)
               + preset("component", protocol="authors", layer_groups=("fourth_quarter", "third_quarter"))
               + preset("hybrid", protocol="authors", base="pre", task="sft", relation="both")
               + preset("unembed", protocol="authors")
               + preset("layer_dropout", protocol="authors", rates=(0.4, 1.0)))
    roles = {"pre": 0, "sft": 1, "both": 2}
    moved = 0.0
    for scheme in schemes:
        compiled = compile_scheme(scheme, names, roles, heads, protocol="authors", tied_embeddings=tied)
        src = compiled.source(offsets, SPANS)[None]
        fast = wg.graft_forward(models, ids, src)
        ref = per_token_forward(models, ids, src)
        assert (fast - ref).abs().max().item() <= TOL, scheme.name
        moved = max(moved, (ref[0, -1] - base(ids).logits[0, -1]).abs().max().item())
    assert moved > 1e-3  # the maps graft something that shows in the logits


# ------------------------------------------------------------ spans only some templates have

def test_a_span_scheme_runs_only_on_templates_that_have_the_span():
    from weightgraft.data.prompts import TestPrompt
    from weightgraft.experiments.examples import Exclusions, prepare

    def prompt(i, template, text, spans):
        return TestPrompt(f"r{i}/{template}", f"r{i}", template, text, "Cy", spans, "second_actor")

    prompts = [
        prompt(0, "head", "Al Bo in in a movie by", {"first_actor": (0, 5), "preposition": (20, 22)}),
        prompt(1, "head", "Ed Fa in in a movie by", {"first_actor": (0, 5), "preposition": (20, 22)}),
        prompt(0, "movie", "Al Bo in in Up by", {"first_actor": (0, 5), "movie_title": (12, 14)}),
        prompt(1, "movie", "Ed Fa in in Up by", {"first_actor": (0, 5)}),  # this one lacks it
    ]
    names = _names(4)
    compiled = [_compile(s, names) for s in preset("position", protocol="authors", spans=True)
                if s.name in ("FE", "LT", "M", "FE+M+LT", "PREP")]
    exclusions = Exclusions()
    prepared = prepare(prompts, tiny_tokenizer(), compiled, "default", exclusions)
    got = {ex.prompt.id: set(ex.sources) for ex in prepared}
    assert got["r0/head"] == got["r1/head"] == {"FE", "LT", "PREP"}  # no example lost
    assert got["r0/movie"] == {"FE", "LT", "M", "FE+M+LT"}
    assert "r1/movie" not in got  # the template has the span, this example does not: excluded
    summary = exclusions.summary()
    assert summary["total"] == 1 and summary["examples"][0]["example_id"] == "r1/movie"
    skipped = {(s["template"], s["scheme"]): s["span"] for s in summary["skipped_schemes"]}
    assert skipped == {("head", "M"): "movie_title", ("head", "FE+M+LT"): "movie_title",
                       ("movie", "PREP"): "preposition"}
