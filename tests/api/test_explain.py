"""A layer selector means those layers: the global slots (embed, final_norm, unembed) come with a
rule only under ``layers=all`` or when its components name them; ``wg.explain`` shows it."""

from __future__ import annotations

import pytest
import torch

import weightgraft as wg

PROMPTS = ["The capital of France is", "Paris is in"]


@pytest.mark.parametrize("protocol", ["paper", "authors"])
def test_a_layer_selector_restricts_to_layer_slots(tiny_pair, protocol):
    pre, _ = tiny_pair("llama")  # 4 layers, untied
    one = wg.explain(wg.Rule(model="sft", layers="3", components="body"), pre, protocol=protocol).iloc[0]
    assert one.layers == [3] and one.global_slots == []
    assert all(s.startswith("layers.3.") for s in one.slots)
    every = wg.explain(wg.Rule(model="sft", layers="3", components="all"), pre, protocol=protocol).iloc[0]
    assert every.global_slots == [] and every.slots == one.slots
    named = wg.explain(wg.Rule(model="sft", layers="3", components="body+unembed"), pre, protocol=protocol).iloc[0]
    assert named.global_slots == ["unembed"]
    whole = wg.explain(wg.Rule(model="sft", components="body"), pre, protocol=protocol).iloc[0]
    assert whole.layers == [0, 1, 2, 3] and set(whole.global_slots) == (
        {"embed", "final_norm"} if protocol == "paper" else {"embed"})


def test_the_graft_follows_the_rule_explain_shows(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    rule = wg.Rule(model="sft", positions="last", layers="3", components="all")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, rule)
    shown = wg.explain(rule, pre).iloc[0].slots
    cols = [wg.slots(pre).index(s) for s in shown]
    enc = tiny_tok(PROMPTS, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    last = mask.sum(1) - 1
    source = torch.zeros(*ids.shape, len(wg.slots(pre)), dtype=torch.long)
    for b in range(len(PROMPTS)):
        source[b, int(last[b]), cols] = 1
    hand = wg.graft_forward([pre, sft], ids, source, attention_mask=mask)
    torch.testing.assert_close(out.logits, hand[torch.arange(len(PROMPTS)), last], rtol=0, atol=1e-12)
    # the unembedding stayed the base's: grafting it too moves the logits
    more = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS,
                    wg.Rule(model="sft", positions="last", layers="3", components="all+unembed"))
    assert (more.logits - out.logits).abs().max() > 1e-3


def test_explain_lists_heads_and_later_rules(tiny_pair):
    pre, _ = tiny_pair("llama")
    table = wg.explain([wg.Rule(model="sft", positions="last", layers="last_half", components="o", heads="0,1"),
                        wg.Rule(model="relation", positions="first_entity", layers="0", components="ffn")], pre)
    assert table.model.tolist() == ["sft", "relation"] and table.positions.tolist() == ["last", "first_entity"]
    assert table.iloc[0].layers == [2, 3] and table.iloc[0].heads == {"layers.2.o": [0, 1], "layers.3.o": [0, 1]}
    assert table.iloc[1].components == sorted(["gate", "up", "down"])
