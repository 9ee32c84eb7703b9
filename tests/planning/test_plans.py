"""Scheme compilation: spans via offsets, set algebra, layer fractions, components."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny, tiny_tokenizer

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.schemes.presets import preset
from weightgraft.schemes.scheme import Rule, Scheme, compile_scheme
from weightgraft.schemes.selectors import (
    SelectorError,
    SpanNotFound,
    layer_group,
    select_components,
    select_layers,
    select_positions,
)

PROMPT = "Keanu Reeves starred in a movie with"
SPANS = {"first_actor": (0, 12), "relation": (13, 30), "preposition": (31, 35)}


@pytest.fixture(scope="module")
def offsets():
    enc = tiny_tokenizer()(PROMPT, return_offsets_mapping=True)
    return enc["offset_mapping"]


def test_spans_are_located_through_offsets(offsets):
    assert select_positions("first_actor", offsets, SPANS) == list(range(12))
    assert select_positions("first_entity", offsets, SPANS) == list(range(12))
    assert select_positions("last", offsets, SPANS) == [len(PROMPT) - 1]
    assert select_positions("preposition", offsets, SPANS) == [31, 32, 33, 34]


def test_set_algebra(offsets):
    n = len(offsets)
    fe_lt = select_positions("first_actor+last", offsets, SPANS)
    assert fe_lt == list(range(12)) + [n - 1]
    assert select_positions("~(first_actor+last)", offsets, SPANS) == list(range(12, n - 1))
    assert select_positions("~first_actor & ~last", offsets, SPANS) == list(range(12, n - 1))
    assert select_positions("0 + -1 + -2", offsets, SPANS) == [0, n - 2, n - 1]
    assert select_positions("all", offsets, SPANS) == list(range(n))


def test_nesting_is_bounded(offsets):
    """Deep nesting is a SelectorError, never a RecursionError; 64 levels still parse."""
    n = len(offsets)
    assert select_positions("~" * 64 + "last", offsets, SPANS) == [n - 1]
    assert select_positions("(" * 64 + "last" + ")" * 64, offsets, SPANS) == [n - 1]
    for expr in ("~" * 65 + "last", "~" * 20000 + "last", "(" * 5000 + "last" + ")" * 5000):
        with pytest.raises(SelectorError, match="more than 64 deep"):
            select_positions(expr, offsets, SPANS)


def test_missing_spans_and_bad_expressions(offsets):
    with pytest.raises(SpanNotFound, match="movie_title"):
        select_positions("movie_title", offsets, SPANS)
    with pytest.raises(SpanNotFound, match="outside"):
        select_positions("99", offsets, SPANS)
    with pytest.raises(SpanNotFound, match="covers no token"):
        select_positions("first_actor", offsets, {"first_actor": (200, 210)})
    with pytest.raises(SelectorError, match="parse"):
        select_positions("first_actor $ last", offsets, SPANS)
    with pytest.raises(SelectorError, match="ends too early"):
        select_positions("first_actor +", offsets, SPANS)


def test_special_tokens_never_belong_to_a_span():
    offsets = [(0, 0), (0, 5), (5, 12)]  # a BOS token has the empty offset (0, 0)
    assert select_positions("first_actor", offsets, {"first_actor": (0, 12)}) == [1, 2]


@pytest.mark.parametrize("n_layers", [2, 6, 12, 18, 30, 32])
def test_layer_fractions_partition_any_depth(n_layers):
    halves = select_layers("first_half", n_layers) + select_layers("last_half", n_layers)
    assert halves == list(range(n_layers))
    if n_layers >= 4:
        quarters = sum((select_layers(f"quarter:{k}", n_layers) for k in range(1, 5)), [])
        assert quarters == list(range(n_layers))
        assert select_layers("last_quarter", n_layers)[-1] == n_layers - 1
        assert select_layers("last_quarter", n_layers) == select_layers("4/4", n_layers)
    if n_layers >= 8:
        eighths = [select_layers(f"eighth:{k}", n_layers) for k in range(1, 9)]
        assert sum(eighths, []) == list(range(n_layers))
        assert max(map(len, eighths)) - min(map(len, eighths)) <= 1


def test_layer_lists_ranges_and_errors():
    assert select_layers("0+3+-1", 8) == [0, 3, 7]
    assert select_layers("2..4", 8) == [2, 3, 4]
    assert select_layers("2:4", 8) == [2, 3]
    assert select_layers("first_half+last_quarter", 8) == [0, 1, 2, 3, 6, 7]
    with pytest.raises(SelectorError, match="beyond the model's depth"):
        select_layers("12", 8)
    with pytest.raises(SelectorError, match="cannot split"):
        layer_group(1, 8, 4)
    with pytest.raises(SelectorError, match="cannot parse"):
        select_layers("middle", 8)


def test_component_groups():
    llama = {"attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down", "embed", "final_norm", "unembed"}
    assert select_components("attn+o", llama) == {"q", "k", "v", "o"}
    assert select_components("ffn", llama - {"gate"}) == {"up", "down"}  # GPT-2 has no gate
    assert "unembed" not in select_components("all-unembed", llama)
    assert select_components("body", llama) == llama - {"unembed"}
    with pytest.raises(SelectorError, match="no component 'gate'"):
        select_components("gate", llama - {"gate"})
    with pytest.raises(SelectorError, match="unknown component 'mlpp'"):
        select_components("mlpp", llama)


def test_compiled_source_for_fe_plus_lt(offsets):
    model = make_tiny("llama", vocab_size=len(tiny_tokenizer()))
    names = wg.slots(model)
    scheme = preset("position")[4]  # FE+LT
    assert scheme.name == "FE+LT"
    compiled = compile_scheme(scheme, names, {"pre": 0, "sft": 1})
    src = compiled.source(offsets, SPANS)
    assert src.shape == (len(offsets), len(names))
    unembed = names.index("unembed")
    grafted_rows = (src[:, :unembed] == 1).all(dim=1)
    assert grafted_rows.nonzero().flatten().tolist() == list(range(12)) + [len(offsets) - 1]
    assert (src[~grafted_rows] == 0).all()
    assert (src[:, unembed] == 0).all()  # the paper keeps the base's unembedding


def test_component_scheme_touches_only_its_layers_and_components(offsets):
    model = make_tiny("llama")  # 2 layers
    names = wg.slots(model)
    scheme = Scheme(name="x", rules=[Rule(model="sft", positions="last", layers="last_half", components="o+up")])
    src = compile_scheme(scheme, names, {"pre": 0, "sft": 1}).source(offsets, SPANS)
    grafted = {names[i] for i in (src[-1] == 1).nonzero().flatten().tolist()}
    assert grafted == {"layers.1.o", "layers.1.up"}
    assert (src[:-1] == 0).all()


def test_later_rules_win_and_unknown_roles_are_refused(offsets):
    names = wg.slots(make_tiny("llama"))
    scheme = Scheme(name="y", rules=[Rule(model="sft", components="all"), Rule(model="task", positions="0", components="all")])
    src = compile_scheme(scheme, names, {"pre": 0, "sft": 1, "task": 2}).source(offsets, SPANS)
    assert (src[0] == 2).all() and (src[1:] == 1).all()
    with pytest.raises(SelectorError, match="role 'task'"):
        compile_scheme(scheme, names, {"pre": 0, "sft": 1})


def test_presets_cover_the_paper():
    names = [s.name for s in preset("position")]
    assert names == ["PRE", "SFT", "FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C"]
    comp = {s.name for s in preset("component", direction="both2one")}
    for c in ("ATTN+O+FFN", "O+FFN", "FFN", "O", "O+FFN-UP", "O+FFN-DOWN"):
        assert f"{c}@last_quarter" in comp
    hybrid = preset("hybrid")
    assert all(s.roles() == {"pre", "task", "relation"} for s in hybrid[2:])
    assert [s.name for s in hybrid[2:]][:2] == ["FE:none", "FE:ATTN"]
    assert preset("position", direction="pre2sft")[2].base == "sft"
    with pytest.raises(SelectorError, match="unknown scheme preset"):
        preset("nope")


def test_layer_dropout_is_seeded(offsets):
    names = wg.slots(make_tiny("llama"))
    a = [compile_scheme(s, names, {"pre": 0, "sft": 1}).source(offsets, SPANS) for s in preset("layer_dropout", rates=[0.5], seeds=[0, 0, 1])]
    assert torch.equal(a[0], a[1])
    assert not torch.equal(a[0], a[2])
    with pytest.raises(ValueError, match="layer_dropout"):
        preset("layer_dropout", rates=[1.5])


def test_head_rules_compile_to_head_maps(offsets):
    model = make_tiny("llama")  # 4 heads, 2 KV heads, 2 layers
    names = wg.slots(model)
    slot_heads = {s.name: s.heads for s in model_slots(model) if s.heads}
    assert slot_heads["layers.0.q"] == 4 and slot_heads["layers.0.k"] == 2
    scheme = Scheme(name="h", rules=[
        Rule(model="sft", positions="last", layers="1", components="o", heads="1,3"),
        Rule(model="sft", positions="0", components="o"),  # a later whole-slot rule wins
    ])
    compiled = compile_scheme(scheme, names, {"pre": 0, "sft": 1}, slot_heads)
    src, heads = compiled.sources(offsets, SPANS)
    assert set(heads) == {"layers.1.o"}
    o = heads["layers.1.o"]
    assert o.shape == (len(offsets), 4)
    assert o[-1].tolist() == [0, 1, 0, 1] and (o[1:-1] == 0).all()
    assert (o[0] == 1).all() and src[0, names.index("layers.1.o")] == 1
    assert src[-1, names.index("layers.1.o")] == 0  # the whole slot (o's bias) stays the base's


def test_head_selection_errors(offsets):
    model = make_tiny("llama")
    names = wg.slots(model)
    slot_heads = {s.name: s.heads for s in model_slots(model) if s.heads}
    roles = {"pre": 0, "sft": 1}
    bad_comp = Scheme(name="a", rules=[Rule(model="sft", components="o+up", heads="0")])
    with pytest.raises(SelectorError, match="q, k, v and o only.*up"):
        compile_scheme(bad_comp, names, roles, slot_heads)
    too_far = Scheme(name="b", rules=[Rule(model="sft", components="k", heads="3")])
    with pytest.raises(SelectorError, match="'k' has 2 heads"):
        compile_scheme(too_far, names, roles, slot_heads)
    with pytest.raises(SelectorError, match="needs slot_heads"):
        compile_scheme(Scheme(name="c", rules=[Rule(model="sft", components="q", heads="0")]), names, roles)
    with pytest.raises(SelectorError, match="cannot parse head selector"):
        compile_scheme(Scheme(name="d", rules=[Rule(model="sft", components="q", heads="x")]), names, roles, slot_heads)
    assert [s.name for s in preset("heads", n_heads=3)][2:] == ["o[0]@last_quarter", "o[1]@last_quarter", "o[2]@last_quarter"]
    with pytest.raises(SelectorError, match="needs n_heads"):
        preset("heads")
