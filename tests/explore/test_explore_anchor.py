"""Painted cells follow their tokens when the prompt is edited (``explore.anchor``): typed in
front, the paint of " with" stays on " with"; a removed word's paint is dropped and named. The
null: keeping paint by position number (what the page did) lands it on another token."""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient

import weightgraft as wg
from weightgraft.explore.anchor import align, anchoring
from weightgraft.explore.app import create_app
from weightgraft.explore.session import Explorer

BEFORE = ["Tre", "vante", " Rhodes", " starred", " in", " a", " movie", " with"]
TYPED_IN_FRONT = ["Yesterday", ",", " Tre", "vante", " Rhodes", " starred", " in", " a", " movie", " with"]
PROMPT = "Keanu Reeves starred in a movie with"
EDITED = "Yesterday, Keanu Reeves starred in a movie with"


def test_typing_in_front_keeps_every_token():
    origin = align(BEFORE, TYPED_IN_FRONT)
    assert origin == [None, None, 0, 1, 2, 3, 4, 5, 6, 7]
    assert all(TYPED_IN_FRONT[new].lstrip() == BEFORE[old].lstrip() for new, old in enumerate(origin) if old is not None)
    # the null: by position number, the paint of " with" (7) sits on " in" after the edit
    assert TYPED_IN_FRONT[7] != BEFORE[7]
    out = anchoring(BEFORE, TYPED_IN_FRONT)
    assert out["dropped"] == [] and {"token": " with", "from": 7, "to": 9} in out["moved"]
    assert len(out["moved"]) == len(BEFORE)


def test_a_removed_or_changed_word_is_named():
    shorter = ["Tre", "vante", " Rhodes", " starred", " in", " a", " with"]
    out = anchoring(BEFORE, shorter)
    assert out["origin"] == [0, 1, 2, 3, 4, 5, 7]
    assert out["dropped"] == [{"token": " movie", "from": 6}]
    assert out["moved"] == [{"token": " with", "from": 7, "to": 6}]
    changed = anchoring(BEFORE, ["Tre", "vante", " Rhodes", " starred", " in", " a", " film", " with"])
    assert changed["origin"] == [0, 1, 2, 3, 4, 5, None, 7] and changed["dropped"] == [{"token": " movie", "from": 6}]
    assert anchoring(BEFORE, BEFORE) == {"origin": list(range(8)), "moved": [], "dropped": []}
    assert anchoring([], ["a"])["origin"] == [None] and anchoring(["a"], [])["dropped"] == [{"token": "a", "from": 0}]


@pytest.fixture(scope="module")
def setup(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    explorer = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    return pre, sft, tiny_tok, TestClient(create_app(explorer), base_url="http://127.0.0.1:8765")


def test_paint_carried_over_an_edit_grafts_the_same_token(setup):
    """Cells painted at the prompt's last token, carried over "Yesterday, " typed in front by the
    endpoint's anchor, graft exactly what a rule at that token's new position grafts."""
    pre, sft, tok, client = setup
    first = client.post("/api/tokens", json={"prompt": PROMPT}).json()["tokens"]
    res = client.post("/api/tokens", json={"prompt": EDITED, "previous": [t["token"] for t in first]})
    assert res.status_code == 200, res.text
    anchor, now = res.json()["anchor"], res.json()["tokens"]
    last_before = len(first) - 1
    new_at = anchor["origin"].index(last_before)
    assert now[new_at]["token"] == first[last_before]["token"] and new_at == len(now) - 1
    # the null: the old position number now holds another character of the prompt
    assert now[last_before]["token"] != first[last_before]["token"]
    names = wg.slots(pre)
    cells = [{"position": new_at, "slot": n, "model": "sft"} for n in names if n.startswith("layers.2.")]
    got = client.post("/api/graft", json={"prompt": EDITED, "cells": cells, "k": 5}).json()
    out = wg.graft({"pre": pre, "sft": sft}, tok, [EDITED], wg.Rule(model="sft", positions=str(new_at), layers="2", components="layer"))
    probs = torch.softmax(out.logits[0], -1)
    values, ids = probs.topk(5)
    assert [e["token_id"] for e in got["top"]["graft"]] == ids.tolist()
    assert [e["prob"] for e in got["top"]["graft"]] == pytest.approx(values.tolist(), abs=1e-12)


def test_previous_is_bounded_and_typed(setup):
    client = setup[3]
    res = client.post("/api/tokens", json={"prompt": PROMPT, "previous": ["a"] * 1000})
    assert res.status_code == 400 and "previous" in res.json()["error"]
    res = client.post("/api/tokens", json={"prompt": PROMPT, "previous": [1, 2]})
    assert res.status_code == 400 and "previous" in res.json()["error"]
    assert client.post("/api/tokens", json={"prompt": PROMPT}).json()["anchor"] is None
