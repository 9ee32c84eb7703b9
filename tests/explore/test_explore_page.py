"""The explore page's own modules, run in Node where it exists (no browser): the cells the page
sends back for a map of heads and neurons (``static/units.js``) make the server build that same
map again, bias parts included; a server that went away is named, not "Failed to fetch"."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

from weightgraft.explore.app import STATIC
from weightgraft.explore.requests import GraftRequest
from weightgraft.explore.session import Explorer

PROMPT = "Keanu Reeves starred in a movie with"


def _node(script: str, data: object = None) -> object:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to run the page's static modules")
    res = subprocess.run([node, "--input-type=module", "-e", script], input=json.dumps(data), capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(res.stdout)


def _module(name: str) -> str:
    return json.dumps((STATIC / name).as_uri())


def test_the_page_resends_a_map_of_units_as_the_same_map(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    explorer = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    n = len(explorer.tokens(GraftRequest(prompt=PROMPT)))
    cells = [{"position": n - 1, "slot": "layers.0.o/h1", "model": "sft"},
             {"position": n - 1, "slot": "layers.3.up/n5", "model": "sft"},
             {"position": 2, "slot": "layers.1.o", "model": "sft"},  # a whole cell, then most of its heads back
             *({"position": 2, "slot": f"layers.1.o/h{h}", "model": "pre"} for h in (0, 1, 3)),
             {"position": 4, "slot": "layers.2.down/bias", "model": "sft"},  # the slot's own part alone
             {"position": 5, "slot": "layers.2.q", "model": "sft"}]
    first = explorer.graft(GraftRequest(prompt=PROMPT, cells=cells, k=3))
    assert set(first["map"]["units"]) == {"layers.0.o", "layers.3.up", "layers.1.o", "layers.2.down"}
    script = (f"import {{ mapCells, readUnits }} from {_module('units.js')};"
              "let s = ''; process.stdin.on('data', (d) => { s += d; }); process.stdin.on('end', () => {"
              "const x = JSON.parse(s); const units = readUnits(x.map.units, x.slots);"
              "process.stdout.write(JSON.stringify(mapCells(x.map.source, units, x.slots, x.map.roles, 0))); });")
    sent = _node(script, {"map": first["map"], "slots": explorer.slot_names})
    assert any(c["slot"] == "layers.2.down/bias" for c in sent["cells"])
    again = explorer.graft(GraftRequest(prompt=PROMPT, cells=sent["cells"], base=sent["base"], k=3))
    assert again["map"]["source"] == first["map"]["source"] and again["map"]["units"] == first["map"]["units"]
    assert [e["prob"] for e in again["top"]["graft"]] == pytest.approx([e["prob"] for e in first["top"]["graft"]], abs=1e-12)
    # the null: the same cells without their units graft something else
    whole = [c for c in sent["cells"] if "/" not in c["slot"]]
    other = explorer.graft(GraftRequest(prompt=PROMPT, cells=whole, base=sent["base"], k=3))
    assert not torch.allclose(torch.tensor([e["prob"] for e in other["top"]["graft"]]),
                              torch.tensor([e["prob"] for e in first["top"]["graft"]]), atol=1e-9)


def test_a_server_that_went_away_is_named():
    script = (f"import {{ getJSON, postJSON }} from {_module('api.js')};"
              "globalThis.fetch = () => Promise.reject(new TypeError('Failed to fetch'));"
              "const out = [];"
              "for (const call of [() => getJSON('/api/info'), () => postJSON('/api/graft', {})]) {"
              "  try { await call(); out.push('answered'); } catch (e) { out.push(e.message); } }"
              "process.stdout.write(JSON.stringify(out));")
    got = _node(script)
    assert len(got) == 2 and all("does not answer" in m and "Failed to fetch" not in m for m in got)


def test_the_page_paints_single_experts_and_resends_them_as_the_same_map(tiny_pair, tiny_tok):
    """Experts painted one by one on the experts grid (``paintUnits``, the list ``parseExperts``
    reads) go back as ``layers.1.experts/e2`` cells (no ``/bias``: a bank has no part outside its
    experts) and the server builds that map; a bad list is one line."""
    pre, sft = tiny_pair("mixtral")
    explorer = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    n = len(explorer.tokens(GraftRequest(prompt=PROMPT)))
    bank = explorer.slot_names.index("layers.1.experts")
    script = (f"import {{ mapCells, paintUnits, parseExperts }} from {_module('units.js')};"
              "let s = ''; process.stdin.on('data', (d) => { s += d; }); process.stdin.on('end', () => {"
              "const x = JSON.parse(s); const state = { info: x.info, source: x.source, units: {} };"
              "paintUnits(state, [x.bank], x.last, parseExperts('2', 4), () => 1);"
              "paintUnits(state, [x.bank], 0, parseExperts('0..3', 4), () => 1);"  # every expert: the whole bank
              "const bad = []; for (const t of ['4', '1..x', '3..1']) { try { parseExperts(t, 4); } catch (e) { bad.push(e.message); } }"
              "process.stdout.write(JSON.stringify({ sent: mapCells(state.source, state.units, x.info.slots, ['pre', 'sft'], 0),"
              " all: parseExperts('all', 4), bad })); });")
    source = [[0] * len(explorer.slot_names) for _ in range(n)]
    got = _node(script, {"info": explorer.info(), "source": source, "bank": bank, "last": n - 1})
    sent = got["sent"]
    assert {"position": n - 1, "slot": "layers.1.experts/e2", "model": "sft"} in sent["cells"]
    assert not any(c["slot"].endswith("/bias") for c in sent["cells"]) and got["all"] is None
    assert len(got["bad"]) == 3 and "no 4" in got["bad"][0]
    out = explorer.graft(GraftRequest(prompt=PROMPT, cells=sent["cells"], base=sent["base"], k=3))
    assert out["map"]["units"] == {"layers.1.experts": {"kind": "expert", "n": 4, "rows": [[n - 1, [0, 0, 1, 0]]]}}
    assert out["map"]["source"][0][bank] == 1  # four experts painted at token 0: the whole bank from sft
