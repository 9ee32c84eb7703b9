"""``wg.tokens``: a prompt's tokens with the labels positions go by, as ``wg.graft`` sees them."""

from __future__ import annotations

import pytest
import torch

import weightgraft as wg

PROMPT = "Keanu Reeves starred in a movie with"
SPANS = {"actor": "Keanu Reeves", "relation": "starred in"}


def test_tokens_lists_positions_tokens_labels_and_spans(tiny_tok):
    table = wg.tokens(tiny_tok, PROMPT, spans=SPANS)
    assert {"position", "token", "label", "spans", "start", "end", "id"} <= set(table.columns)
    enc = tiny_tok(PROMPT)["input_ids"]
    assert table.id.tolist() == list(enc) and table.position.tolist() == list(range(len(enc)))
    assert table.label.iloc[-1] == "last"
    actor_end = max(i for i, s in enumerate(table.spans) if s.startswith("actor"))
    assert table.label[actor_end] == "first_entity" and table.label[actor_end - 2] == "first_entity-2"
    assert table.label[actor_end + 1] == "first_entity+1"
    assert "(first_entity)" in table.spans[0] and "relation" in set(table.spans)
    # the text of each token is where the offsets say
    for row in table.itertuples():
        assert PROMPT[row.start:row.end] == row.token


def test_the_spans_column_is_what_a_span_selector_grafts(tiny_pair, tiny_tok):
    """A span name as a position selector takes every token the ``spans`` column gives it:
    grafting at 'first_entity' equals grafting at those indices."""
    pre, sft = tiny_pair("llama")
    table = wg.tokens(tiny_tok, PROMPT, spans=SPANS)
    indices = table.position[table.spans.str.contains("first_entity")].tolist()
    by_name = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [PROMPT],
                       wg.Rule(model="sft", positions="first_entity", components="body"), spans=[SPANS])
    by_index = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [PROMPT],
                        wg.Rule(model="sft", positions="+".join(map(str, indices)), components="body"))
    assert torch.equal(by_name.logits, by_index.logits)
    plain = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [PROMPT], [])
    assert not torch.equal(by_name.logits, plain.logits)


def test_tokens_refuses_a_span_the_prompt_lacks(tiny_tok):
    with pytest.raises(wg.GraftInputError, match="Meryl Streep"):
        wg.tokens(tiny_tok, PROMPT, spans={"actor": "Meryl Streep"})
