"""``weightgraft explore`` on a mixture of experts and on hybrids: the grids list the router, the
bank and a hybrid's mixer; painted cells, single experts (``layers.1.experts/e2``) and rules with
``experts`` give the engine's logits; a bad expert is refused in one line; an expert map folder
(``weightgraft experts``) is read as the page's overlay."""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.explore.app import create_app
from weightgraft.explore.expert_view import ExpertMapView
from weightgraft.explore.session import Explorer
from weightgraft.report.run import ReportError

PROMPT = "Keanu Reeves starred in a movie with"
SERVED = "http://127.0.0.1:8765"
SLOW_FIXTURES = ("overlay",)  # its overlay tests are `slow` (tests/conftest.py): a `weightgraft experts` run


@pytest.fixture(scope="module")
def moe(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("mixtral")
    return pre, sft, TestClient(base_url=SERVED, app=create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok)))


def _probs(top):
    return {e["token_id"]: e["prob"] for e in top}


def _engine(models, tok, source_rows=(), experts=None):
    """Last-token probabilities of ``wg.graft_forward``: PRE everywhere but the (position, slot)
    cells in ``source_rows`` from SFT, and ``experts`` ({bank: [(position, expert)]}) from SFT."""
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    names = wg.slots(models[0])
    source = torch.zeros(1, ids.shape[1], len(names), dtype=torch.long)
    for t, slot in source_rows:
        source[0, t, names.index(slot)] = 1
    expert_source = {}
    for bank, picks in (experts or {}).items():
        n = next(s.experts for s in model_slots(models[0]) if s.name == bank)
        m = torch.zeros(1, ids.shape[1], n, dtype=torch.long)
        for t, e in picks:
            m[0, t, e] = 1
        expert_source[bank] = m
    logits = wg.graft_forward(list(models), ids, source, expert_source=expert_source or None)
    return torch.softmax(logits[0, -1], dim=-1), ids.shape[1]


def _same(got, probs, k=8):
    values, idx = probs.topk(k)
    assert [e["token_id"] for e in got] == idx.tolist()
    assert [e["prob"] for e in got] == pytest.approx(values.tolist(), abs=1e-9)


def test_the_moe_grids_list_router_and_experts(moe):
    pre, _, client = moe
    info = client.get("/api/info").json()
    grids = {g["key"]: g for g in info["layout"]["grids"]}
    assert {"router", "experts"} <= set(grids) and "ffn" not in grids
    for key in ("router", "experts"):
        assert [[info["slots"][i] for i in layer] for layer in grids[key]["layers"]] == [
            [f"layers.{i}.{key}"] for i in range(info["layout"]["n_layers"])]
    bank = info["slots"].index("layers.1.experts")
    assert info["units"][bank] == {"kind": "expert", "n": 4}
    assert info["units"][info["slots"].index("layers.1.router")] is None


def test_one_expert_at_the_last_token_is_the_engines_graft(moe, tiny_tok):
    """Expert 2 of layer 1 at the last token, as a cell and as a rule: the engine's logits with
    that expert map, both for a prompt's first request and for a stroke resumed from kept states."""
    pre, sft, client = moe
    want, n = _engine((pre, sft), tiny_tok, experts={"layers.1.experts": [(-1, 2)]})
    plain, _ = _engine((pre, sft), tiny_tok)
    assert not torch.allclose(want, plain)  # the router picks expert 2 there: the graft moves the answer
    cell = {"prompt": PROMPT, "k": 8, "cells": [{"position": n - 1, "slot": "layers.1.experts/e2", "model": "sft"}]}
    rule = {"prompt": PROMPT, "k": 8, "rules": [{"model": "sft", "positions": "last", "layers": "1",
                                                 "components": "experts", "experts": "2"}]}
    fresh = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    first = TestClient(base_url=SERVED, app=create_app(fresh)).post("/api/graft", json=cell)  # a new prompt's pass
    assert first.status_code == 200, first.text
    _same(first.json()["top"]["graft"], want)
    client.post("/api/graft", json={"prompt": PROMPT})  # the prompt's states kept: the strokes below resume
    for body in (cell, rule):
        res = client.post("/api/graft", json=body)
        assert res.status_code == 200, res.text
        got = res.json()
        _same(got["top"]["graft"], want)
        _same(got["top"]["pre"], plain)
        assert got["map"]["experts"] == ["layers.1.experts"] and got["map"]["heads"] == []
        assert got["map"]["units"] == {"layers.1.experts": {"kind": "expert", "n": 4, "rows": [[n - 1, [0, 0, 1, 0]]]}}


def test_router_and_bank_cells_are_the_engines(moe, tiny_tok):
    pre, sft, client = moe
    _, n = _engine((pre, sft), tiny_tok)
    cells = [(n - 1, "layers.1.router"), (2, "layers.0.experts"), (n - 1, "layers.0.router")]
    want, _ = _engine((pre, sft), tiny_tok, cells)
    res = client.post("/api/graft", json={"prompt": PROMPT, "k": 8, "cells": [
        {"position": t, "slot": s, "model": "sft"} for t, s in cells]})
    assert res.status_code == 200, res.text
    _same(res.json()["top"]["graft"], want)


@pytest.mark.parametrize("cell,match", [
    ({"position": 3, "slot": "layers.1.experts/e4", "model": "sft"}, "cells.0: layers.1.experts has 4 experts (0..3); no expert 4"),
    ({"position": 3, "slot": "layers.1.experts/h1", "model": "sft"}, "write layers.1.experts/e<index>"),
    ({"position": 3, "slot": "layers.1.experts/bias", "model": "sft"}, "no part outside them"),
    ({"position": 3, "slot": "layers.1.router/e1", "model": "sft"}, "no heads or neurons and is no expert bank"),
    ({"position": 3, "slot": "layers.1.experts/ex", "model": "sft"}, "not a cell name"),
])
def test_a_bad_expert_is_refused_in_one_line(moe, cell, match):
    res = moe[2].post("/api/graft", json={"prompt": PROMPT, "cells": [cell]})
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert match in error and "\n" not in error


def test_a_rule_naming_a_missing_expert_is_refused_in_one_line(moe):
    res = moe[2].post("/api/graft", json={"prompt": PROMPT, "rules": [
        {"model": "sft", "positions": "last", "components": "experts", "experts": "9"}]})
    assert res.status_code == 400, res.text
    assert "9" in res.json()["error"] and "\n" not in res.json()["error"]


@pytest.mark.parametrize("arch", ["lfm2", "qwen3_5_text"])
def test_hybrids_paint_their_mixers(tiny_pair, tiny_tok, arch):
    pre, sft = tiny_pair(arch)
    client = TestClient(base_url=SERVED, app=create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok)))
    info = client.get("/api/info").json()
    grids = {g["key"]: g for g in info["layout"]["grids"]}
    mixer_layers = [i for i, layer in enumerate(grids["mixer"]["layers"]) if layer]
    assert mixer_layers and all(not grids["attn"]["layers"][i] for i in mixer_layers)  # a mixer layer has no q/k/v
    layer = mixer_layers[0]
    slots = [info["slots"][i] for i in grids["mixer"]["layers"][layer]]
    _, n = _engine((pre, sft), tiny_tok)
    cells = [(t, s) for t in (1, n - 1) for s in slots]
    want, _ = _engine((pre, sft), tiny_tok, cells)
    res = client.post("/api/graft", json={"prompt": PROMPT, "k": 8, "cells": [
        {"position": t, "slot": s, "model": "sft"} for t, s in cells]})
    assert res.status_code == 200, res.text
    _same(res.json()["top"]["graft"], want)


# ---------------------------------------------------------------- the expert map's overlay

@pytest.fixture(scope="module")
def overlay(experts_out, moe_dirs):
    """The map's folder, and the app over the models it was computed on (loaded as explore loads them)."""
    from weightgraft.models import load_model

    loaded = {r: load_model(moe_dirs[r]) for r in ("pre", "sft")}
    explorer = Explorer({r: lm.model for r, lm in loaded.items()}, loaded["pre"].tokenizer)
    view = ExpertMapView(experts_out)
    view.compare_weights({r: lm.weights_sha256 for r, lm in loaded.items()})
    return experts_out, view, TestClient(base_url=SERVED, app=create_app(explorer, experts=view))


def test_the_expert_map_overlay_reads_a_weightgraft_experts_folder(overlay):
    import pandas as pd

    experts_out, view, client = overlay
    assert view.weights == {"pre": "same weights", "sft": "same weights"}
    assert client.get("/api/info").json()["experts"] is True
    got = client.get("/api/experts").json()
    assert got["models"] == ["sft", "control"] and got["regions"] == ["first_entity", "last"]
    assert got["templates"] == ["headline", "qa"] and got["n_experts"] == 4 and got["layers"] == [0, 1]
    assert "mean over the map's prompts" in got["meaning"] and got["examples"]["qa"]
    table = pd.read_csv(experts_out / "experts.csv")
    row = table[(table["model"] == "sft") & (table["template"] == "qa") & (table["region"] == "last")
                & (table["layer"] == 1) & (table["expert"] == 2)].iloc[0]
    cell = dict(zip(got["columns"], next(r for r in got["cells"]["sft"]["qa"]["last"] if r[:2] == [1, 2])))
    assert cell["effect"] == pytest.approx(row["effect"]) and cell["pick_rate"] == pytest.approx(row["pick_rate"])
    assert (cell["ci_low"] is None) == pd.isna(row["ci_low"]) and (cell["declined"] is None) == pd.isna(row["declined"])
    # a click: that expert of that layer at the region's tokens, from the map's model, on an example of the map
    example = got["examples"]["qa"][0]
    for region in got["regions"]:
        res = client.post("/api/graft", json={"prompt": example["prompt"], "spans": example["spans"], "rules": [
            {"model": "sft", "positions": region, "layers": "1", "components": "experts", "experts": "2"}]})
        assert res.status_code == 200, res.text


def test_an_expert_map_the_models_do_not_fit_is_refused(overlay, tiny_pair, tiny_tok):
    experts_out = overlay[0]
    pre, sft = tiny_pair("llama")
    with pytest.raises(ReportError, match="the map has 4 experts at layer 0"):
        create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok), experts=ExpertMapView(experts_out))
    with pytest.raises(ReportError, match="not a .weightgraft experts. folder|no manifest.json"):
        ExpertMapView(experts_out / "report")
