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
    assert table.label[actor_end] == "first_entity_last" and table.label[actor_end - 2] == "first_entity_last-2"
    assert table.label[actor_end + 1] == "first_entity_last+1"
    assert "first_entity" not in set(table.label)  # the whole entity is a span, not one token's label
    assert table.spans[actor_end].split(", ") == ["actor", "first_entity"] and "relation" in set(table.spans)
    # the text of each token is where the offsets say
    for row in table.itertuples():
        assert PROMPT[row.start:row.end] == row.token


def test_the_spans_column_is_what_a_span_selector_grafts(tiny_pair, tiny_tok):
    """A span name as a position selector takes every token the ``spans`` column gives it:
    grafting at 'first_entity' equals grafting at those indices."""
    pre, sft = tiny_pair("llama")
    table = wg.tokens(tiny_tok, PROMPT, spans=SPANS)
    indices = table.position[table.spans.str.split(", ").map(lambda names: "first_entity" in names)].tolist()
    assert len(indices) == len("Keanu Reeves")  # every token of the entity, not its last one
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


def _grafted_rows(out: wg.GraftOutput) -> list[int]:
    """The positions where the pass took any slot from the donor (role index 1)."""
    return (out.source[0] == 1).any(dim=1).nonzero().flatten().tolist()


@pytest.mark.parametrize("prompt, spans", [
    (PROMPT, SPANS),
    ("So Keanu Reeves starred in a movie with", {"actor": "Keanu Reeves", "relation": "starred in"}),
    ("Yesterday starred in a movie with", {"relation": "starred in", "actor": "movie"}),
])
def test_every_label_and_span_name_grafts_the_tokens_listed_under_it(tiny_pair, tiny_tok, prompt, spans):
    """A name in ``wg.tokens``'s ``label`` or ``spans`` column is a position selector that grafts
    exactly the tokens the table lists under it: ``first_entity`` is the whole entity, its last
    token ``first_entity_last`` (and ``first_entity_last-k``, ``relation_last+k``, ``tok{i}``)
    one token each. On the old labels the entity's last token was ``first_entity`` too."""
    pre, sft = tiny_pair("llama")
    table = wg.tokens(tiny_tok, prompt, spans=spans)
    listed: dict[str, list[int]] = {}
    for row in table.itertuples():
        for name in [row.label, *(n for n in row.spans.split(", ") if n)]:
            listed.setdefault(name, []).append(row.position)
    assert {"first_entity", "first_entity_last", "last", "actor", "relation"} <= set(listed)
    assert len(listed["first_entity"]) > 1 and listed["first_entity_last"] == listed["first_entity"][-1:]
    assert all(len(listed[label]) == 1 for label in table.label)  # one token per label
    for name, positions in listed.items():
        out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompt,
                       wg.Rule(model="sft", positions=name, components="body"), spans=spans)
        assert _grafted_rows(out) == positions, name
