"""A rule's ``scale`` in ``weightgraft explore``: a request's scaled rule grafts what ``wg.graft``
grafts with that ``Rule(scale=...)`` (its scaled model built once and kept, a few at most), scale
1 is no scale, a bad scale is a one-line 400, and a scaled map sent back as cells (the page's
paint, carried over an edit of the prompt by the anchor) keeps its scale."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from starlette.testclient import TestClient

import weightgraft as wg
from weightgraft.explore.app import STATIC, create_app
from weightgraft.explore.session import Explorer

PROMPT = "Keanu Reeves starred in a movie with"
EDITED = "Yesterday, Keanu Reeves starred in a movie with"
SPANS = {"actor": "Keanu Reeves", "relation": "starred in"}
SCALED = {"model": "sft", "positions": "actor+last", "layers": "last_half", "components": "o+ffn"}


@pytest.fixture(scope="module")
def pre_sft(tiny_pair):
    return tiny_pair("llama")


@pytest.fixture()
def explorer(pre_sft, tiny_tok):
    pre, sft = pre_sft
    return Explorer({"pre": pre, "sft": sft}, tiny_tok)


@pytest.fixture()
def client(explorer):
    return TestClient(base_url="http://127.0.0.1:8765", app=create_app(explorer))


def _graft(client, **body):
    res = client.post("/api/graft", json={"prompt": PROMPT, "spans": SPANS, "answer": "Tom", "k": 6, **body})
    assert res.status_code == 200, res.text
    return res.json()


def _same(got, out, tok):
    """The app's top-k and answer are ``wg.graft``'s (float64: to 1e-12)."""
    probs = torch.softmax(out.logits[0], dim=-1)
    values, ids = probs.topk(6)
    assert [e["token_id"] for e in got["top"]["graft"]] == ids.tolist()
    assert [e["prob"] for e in got["top"]["graft"]] == pytest.approx(values.tolist(), abs=1e-12)
    answer = tok(" Tom", add_special_tokens=False)["input_ids"][0]
    assert got["answer"]["prob"]["graft"] == pytest.approx(float(probs[answer]), abs=1e-12)
    assert got["answer"]["rank"]["graft"] == int((out.logits[0] > out.logits[0][answer]).sum())


@pytest.mark.parametrize("scale", [-1.0, 0.5, 2.0, 0.0])
@pytest.mark.parametrize("base,model", [("pre", "sft"), ("sft", "pre")])
def test_a_scaled_rule_equals_wg_graft(client, explorer, pre_sft, tiny_tok, scale, base, model):
    rules = [{**SCALED, "model": model, "scale": scale}, {"model": model, "positions": "relation", "components": "attn"}]
    got = _graft(client, rules=rules, base=base)
    pre, sft = pre_sft
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [PROMPT], [wg.Rule(**r) for r in rules], base=base, spans=[SPANS])
    _same(got, out, tiny_tok)
    scaled = [] if scale == 0 else [wg.Rule(**rules[0]).role_under(base)]
    assert got["map"]["roles"] == ["pre", "sft", *scaled]
    # the map the pass ran is wg.graft's (its roles: the base first, then the other, then the scaled role)
    order = torch.tensor([0, 1, 2] if base == "pre" else [1, 0, 2])
    assert torch.equal(torch.tensor(got["map"]["source"]), order[out.source[0]])
    # the null: the same rules at scale 1 graft something else
    plain = _graft(client, rules=[{**r, "scale": 1} for r in rules], base=base)
    assert plain["answer"]["prob"]["graft"] != pytest.approx(got["answer"]["prob"]["graft"], abs=1e-6)


def test_scale_one_is_no_scale_and_scaled_models_are_kept_a_few(client, explorer, pre_sft, tiny_tok):
    pre, sft = pre_sft
    none = _graft(client, rules=[SCALED])  # a new prompt: its baselines' states kept
    one = _graft(client, rules=[{**SCALED, "scale": 1}])
    assert one["map"] == none["map"] and one["map"]["roles"] == ["pre", "sft"]
    for row in ("pre", "sft", "graft"):  # (the second resumes from the first's states: equal to float64 rounding)
        assert [e["token_id"] for e in one["top"][row]] == [e["token_id"] for e in none["top"][row]]
        assert [e["prob"] for e in one["top"][row]] == pytest.approx([e["prob"] for e in none["top"][row]], abs=1e-12)
    assert not explorer.scaled.kept
    twice = _graft(client, rules=[{**SCALED, "scale": 2}])
    model = explorer.scaled.kept[("sft", "pre", 2.0)]
    assert _graft(client, rules=[{**SCALED, "scale": 2}])["top"] == twice["top"]
    assert explorer.scaled.kept[("sft", "pre", 2.0)] is model  # built once, reused by the next stroke
    # a stroke after a scaled one resumes from the kept states as before (equal to wg.graft)
    again = _graft(client, rules=[{**SCALED, "layers": "3"}])
    _same(again, wg.graft({"pre": pre, "sft": sft}, tiny_tok, [PROMPT], wg.Rule(**{**SCALED, "layers": "3"}), spans=[SPANS]),
          tiny_tok)
    for scale in (3.0, -2.0, 0.25, 4.0):
        _graft(client, rules=[{**SCALED, "scale": scale}])
    assert list(explorer.scaled.kept) == [("sft", "pre", s) for s in (-2.0, 0.25, 4.0)]  # the last 3 only


@pytest.mark.parametrize("body,match", [
    ({"rules": [{"model": "sft", "scale": "nan"}]}, "rules.0.scale: Input should be a valid number"),
    ({"rules": [{"model": "sft", "scale": "2"}]}, "rules.0.scale"),
    ({"rules": [{"model": "sft", "scale": True}]}, "rules.0.scale"),
    ({"rules": [{"model": "sft", "scale": None}]}, "rules.0.scale"),
    ({"rules": [{"model": "sft"}, {"model": "sft", "scale": [2]}]}, "rules.1.scale"),
    ({"rules": [{"model": "zzz", "scale": 2}]}, "zzz"),
    ({"cells": [{"position": 0, "slot": "embed", "model": "scaled(sft, nan)"}]}, "cells.0: model spec"),
    ({"cells": [{"position": 0, "slot": "embed", "model": "scaled(zzz, 2)"}]}, "cells.0: 'scaled(zzz, 2)' scales role 'zzz'"),
    ({"cells": [{"position": 0, "slot": "embed", "model": "scaled(sft)"}]}, "cells.0: model spec"),
    ({"cells": [{"position": 0, "slot": "embed", "model": "scaled(sft, 2, base=sft)"}]}, "same role"),
    ({"cells": [], "base": "scaled(zzz, 2)"}, "base: 'scaled(zzz, 2)' scales role 'zzz'"),
    ({"rules": [], "base": "scaled(sft, 2)"}, "base 'scaled(sft, 2)' is not one of the models"),
])
def test_a_bad_scale_is_a_one_line_400(client, body, match):
    res = client.post("/api/graft", json={"prompt": PROMPT, **body})
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert match in error and "\n" not in error and "Traceback" not in error


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_scale_json_reads_as_not_finite_is_refused(client, literal):
    body = '{"prompt": "%s", "rules": [{"model": "sft", "scale": %s}]}' % (PROMPT, literal)
    res = client.post("/api/graft", content=body.encode(), headers={"content-type": "application/json"})
    assert res.status_code == 400, res.text
    assert res.json()["error"].startswith("rules.0.scale: scale must be a finite number")


def _carried(client, map_: dict, before: str, after: str) -> list[dict]:
    """The map's cells carried to ``after`` as the page carries paint: rows follow their tokens
    (``/api/tokens``' anchor), each cell named by its role in the map's ``roles``."""
    old = client.post("/api/tokens", json={"prompt": before}).json()["tokens"]
    res = client.post("/api/tokens", json={"prompt": after, "previous": [t["token"] for t in old]}).json()
    slots = client.get("/api/info").json()["slots"]
    base = map_["roles"].index(map_["base"])
    return [{"position": t, "slot": slots[s], "model": map_["roles"][r]}
            for t, o in enumerate(res["anchor"]["origin"]) if o is not None
            for s, r in enumerate(map_["source"][o]) if r != base]


def test_a_scaled_map_sent_back_as_cells_keeps_its_scale_over_an_edit(client, pre_sft, tiny_tok):
    pre, sft = pre_sft
    rules = [{"model": "sft", "positions": "last", "layers": "first_half", "components": "attn+o", "scale": 2.5},
             {"model": "sft", "positions": "last", "layers": "last_half", "components": "ffn", "scale": -1}]
    first = _graft(client, rules=rules, spans={})
    assert first["map"]["roles"] == ["pre", "sft", "scaled(sft, 2.5)", "scaled(sft, -1)"]
    same = _graft(client, cells=_carried(client, first["map"], PROMPT, PROMPT), spans={})
    assert same["map"] == first["map"]
    assert [e["prob"] for e in same["top"]["graft"]] == pytest.approx([e["prob"] for e in first["top"]["graft"]], abs=1e-12)
    # "Yesterday, " typed in front: the last token's scaled cells follow it to its new position
    cells = _carried(client, first["map"], PROMPT, EDITED)
    got = client.post("/api/graft", json={"prompt": EDITED, "cells": cells, "answer": "Tom", "k": 6}).json()
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [EDITED], [wg.Rule(**r) for r in rules])
    _same(got, out, tiny_tok)
    # the null: the cells at scale 1 (their donor's plain name) graft something else
    plain = [{**c, "model": "sft"} for c in cells]
    other = client.post("/api/graft", json={"prompt": EDITED, "cells": plain, "answer": "Tom", "k": 6}).json()
    assert other["answer"]["prob"]["graft"] != pytest.approx(got["answer"]["prob"]["graft"], abs=1e-6)
    # scaled roles at scale 1 and 0 are their donor and their base
    ones = [{**c, "model": "scaled(sft, 1)"} for c in cells]
    assert client.post("/api/graft", json={"prompt": EDITED, "cells": ones, "k": 6}).json()["map"]["roles"] == ["pre", "sft"]


@pytest.mark.parametrize("positions", ["last", "all"])
def test_the_page_resends_a_scaled_map_by_its_role_names(explorer, tiny_tok, positions):
    """``static/units.js``' ``mapCells`` (run in Node where it exists) names a scaled role's cells
    by the map's ``roles``, over the scaled role where most cells are its: the server builds the
    same map from them."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to run the page's static modules")
    from weightgraft.explore.requests import GraftRequest

    first = explorer.graft(GraftRequest(prompt=PROMPT, k=3, rules=[
        {"model": "sft", "positions": positions, "components": "body", "scale": 2}]))
    script = (f"import {{ mapCells }} from {json.dumps((STATIC / 'units.js').as_uri())};"
              "let s = ''; process.stdin.on('data', (d) => { s += d; }); process.stdin.on('end', () => {"
              "const x = JSON.parse(s);"
              "process.stdout.write(JSON.stringify(mapCells(x.map.source, {}, x.slots, x.map.roles, 0))); });")
    res = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60,
                         input=json.dumps({"map": first["map"], "slots": explorer.slot_names}), check=True)
    sent = json.loads(res.stdout)
    assert {c["model"] for c in sent["cells"]} == {"scaled(sft, 2)" if positions == "last" else "pre"}
    assert sent["base"] == ("pre" if positions == "last" else "scaled(sft, 2)")
    again = explorer.graft(GraftRequest(prompt=PROMPT, cells=sent["cells"], base=sent["base"], k=3))
    assert again["map"]["source"] == first["map"]["source"] and again["map"]["roles"] == first["map"]["roles"]
    assert [e["prob"] for e in again["top"]["graft"]] == pytest.approx([e["prob"] for e in first["top"]["graft"]], abs=1e-12)
