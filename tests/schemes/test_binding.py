"""``schemes.binding``: the one place a graft is prepared (roles, rules as schemes, prompts,
tokenizer, compiled against the base model, encoded). Every front door, explore and the runner
come through it, so its checks and messages are the same everywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import weightgraft as wg
from weightgraft.engine.forward import slots
from weightgraft.schemes.binding import GraftInputError, compile_for, prepare_graft
from weightgraft.schemes.selectors import SelectorError

SRC = Path(__file__).resolve().parents[2] / "src" / "weightgraft"
PROMPTS = ["The capital of France is", "Paris is in"]
FRONT_DOORS = ["api/graft.py", "api/compare.py", "api/generate.py", "api/grafted.py", "explore/session.py"]


def _calls(path: Path) -> set[str]:
    """Names of the functions a module calls (plain and attribute calls)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def test_only_binding_compiles_schemes_and_every_front_door_prepares_through_it():
    compiling = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "compile_scheme" in _calls(p)}
    assert compiling == {"schemes/binding.py"}
    for door in FRONT_DOORS:
        assert "prepare_graft" in _calls(SRC / door), door
    assert "compile_for" in _calls(SRC / "experiments" / "runner.py")


def test_prepared_roles_put_the_base_first_and_index_the_source(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    rule = wg.Rule(model="sft", positions="last", layers="-1", components="o")
    prepared = prepare_graft({"pre": pre, "sft": sft}, rule, base="sft", prompts=PROMPTS, tokenizer=tiny_tok)
    assert prepared.roles == ["sft", "pre"] and prepared.models[0] is sft
    (enc, _) = prepared.encode(tiny_tok, PROMPTS)
    o = slots(pre).index(f"layers.{pre.config.num_hidden_layers - 1}.o")
    # the scheme's base is the base role (index 0 here): "sft" everywhere, so every value is 0
    assert int(enc.source.max()) == 0 and enc.source.shape == (len(enc.input_ids), len(slots(pre)))
    # a Scheme keeps its own base: the app's role order stays, and only the rule's cell is "sft"
    scheme = wg.Scheme(name="graft", base="pre", rules=[rule])
    ordered = prepare_graft({"pre": pre, "sft": sft}, scheme, prompts=PROMPTS)
    (enc, _) = ordered.encode(tiny_tok, PROMPTS)
    assert ordered.roles == ["pre", "sft"]
    assert int(enc.source.sum()) == 1 and int(enc.source[-1, o]) == 1


def test_the_runner_and_the_front_doors_word_a_bad_selector_alike(tiny_pair):
    pre, sft = tiny_pair("llama")
    scheme = wg.Scheme(name="deep", base="pre", rules=[wg.Rule(model="sft", layers="9")])
    with pytest.raises(SelectorError) as raw:  # a run's config error
        compile_for([scheme], pre, ["pre", "sft"], "paper")
    with pytest.raises(GraftInputError) as bound:  # a notebook call's input error
        prepare_graft({"pre": pre, "sft": sft}, scheme)
    assert str(raw.value) == str(bound.value) and "beyond the model's depth" in str(bound.value)


def test_many_schemes_keep_distinct_names_and_one_scheme_stays_one(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    models = {"pre": pre, "sft": sft}
    with pytest.raises(GraftInputError, match="two schemes are named 'X'"):
        prepare_graft(models, [wg.Scheme(name="X"), wg.Scheme(name="X")], many=True)
    with pytest.raises(GraftInputError, match="rules must be a weightgraft.Rule"):
        prepare_graft(models, [wg.Scheme(name="X"), wg.Scheme(name="Y")])
    with pytest.raises(GraftInputError, match="no schemes given"):
        prepare_graft(models, [], many=True)
    empty = prepare_graft(models, [])  # no rules: the base alone (wg.generate with rules=None)
    assert [s.rules for s in empty.schemes] == [[]]
    with pytest.raises(GraftInputError, match="slow"):
        prepare_graft(models, [], tokenizer=object())


def test_encode_names_the_prompt_a_rule_cannot_place(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    prepared = prepare_graft({"pre": pre, "sft": sft}, wg.Rule(model="sft", positions="city"),
                             prompts=PROMPTS, spans=[{}, {"city": "Paris"}])
    with pytest.raises(GraftInputError, match=r"prompt 0 \('The capital of France is'\): .*city"):
        prepared.encode(tiny_tok, PROMPTS)
    only = prepare_graft({"pre": pre, "sft": sft}, wg.Rule(model="sft", positions="city"),
                         prompts=PROMPTS[1:], spans=[{"city": "Paris"}])
    (enc,) = only.encode(tiny_tok, PROMPTS[1:])
    assert bool((enc.source == 1).any()) and isinstance(enc.source, torch.Tensor)
