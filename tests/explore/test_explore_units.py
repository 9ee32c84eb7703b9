"""Sets of heads and neurons in ``weightgraft explore``: a tiny localize run's found set of heads
(``units: head``) and of neurons (``units: neuron``), applied through the API at the positions
its labels name, equals the per-token definition of grafting those units (and, for heads,
``wg.graft`` with per-head rules) to float64 precision; whole cells still apply as before; unit
cells that name no unit are refused with one line."""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient
from tiny_world import loader64, write_world

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.cells import WHOLE, parse_cell_name
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.explore.app import create_app
from weightgraft.explore.artifacts import LocalizeView
from weightgraft.explore.cells import cell_maps
from weightgraft.explore.requests import Cell, RequestError
from weightgraft.explore.session import Explorer

SERVED = "http://127.0.0.1:8765"
TOL = 1e-12  # float64 models


SLOW_FIXTURES = ("unit_run",)  # its tests are `slow` (tests/conftest.py): localize by heads, then by neurons


@pytest.fixture(scope="module", params=["head", "neuron"])
def unit_run(request, tmp_path_factory):
    """A tiny localize run that searches heads (or neurons), served with its models."""
    from weightgraft.api.localize import localize
    from weightgraft.localization.config import parse_localize_config

    units = request.param
    tmp = tmp_path_factory.mktemp(f"explore_{units}")
    config = parse_localize_config({
        "name": units, "data": str(write_world(tmp / "data", n=4)), "out": str(tmp / units),
        "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "templates": ["qa"],
        "graft_directions": ["sufficiency"], "exact": 1, "batch_size": 4, "report": False,
        "units": units, "exact_units": 4, "dtype": "float64",
        "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"target_share": 0.9, "max_cells": 64, "controls": 0, "missed_sample": 0, "refine": False}})
    result = localize(config, progress=False, load=loader64)
    pre, sft = loader64("tiny-llama:pre"), loader64("tiny-llama:sft")
    explorer = Explorer({"pre": pre.model, "sft": sft.model}, pre.tokenizer)
    client = TestClient(base_url=SERVED, app=create_app(explorer, localize=LocalizeView(result.run_dir)))
    return units, client, pre.model, sft.model, pre.tokenizer


def _placed(client, example, keys):
    """The set's keys at every token of the example that carries their position label."""
    toks = client.post("/api/tokens", json={"prompt": example["prompt"], "spans": example["spans"]}).json()["tokens"]
    cells = [{"position": t["position"], "slot": k["slot"], "model": "sft"}
             for k in keys for t in toks if t["label"] == k["position_label"]]
    assert {k["position_label"] for k in keys} <= {t["label"] for t in toks}, "every key lands on a token"
    return toks, cells


def _definition(pre, sft, ids, cells):
    """The per-token definition (``engine.reference``) of grafting these cells from SFT into
    PRE: a whole cell every unit of its slot, a unit cell its own unit."""
    slot_list = model_slots(pre)
    index = {s.name: i for i, s in enumerate(slot_list)}
    n = len(ids)
    source = torch.zeros(1, n, len(slot_list), dtype=torch.long)
    chosen: dict[str, list[tuple[int, int]]] = {}
    for c in cells:
        name, unit = parse_cell_name(c["slot"])
        if unit == WHOLE:
            source[0, c["position"], index[name]] = 1
        else:
            assert unit >= 0, "tiny Llama has no o/down bias: no rest keys"
            chosen.setdefault(name, []).append((c["position"], unit))
    heads, neurons = {}, {}
    for name, units in chosen.items():
        slot = slot_list[index[name]]
        maps = source[:, :, index[name], None].repeat(1, 1, slot.units(slot.unit_kind())).clone()
        for t, u in units:
            maps[0, t, u] = 1
        (heads if slot.heads else neurons)[name] = maps
    logits = per_token_forward([pre, sft], torch.tensor([ids]), SourceMap(source, heads, neurons))
    return logits[0, -1]


def _rules(cells):
    """The same cells as ``wg.graft`` rules: one per cell, per-head rules for head cells."""
    rules = []
    for c in cells:
        name, unit = parse_cell_name(c["slot"])
        layer, comp = (name.split(".")[1], name.split(".")[2]) if name.startswith("layers.") else ("all", name)
        rules.append(wg.Rule(model="sft", positions=str(c["position"]), layers=layer, components=comp,
                             heads=None if unit == WHOLE else str(unit)))
    return rules


def _probs_equal(got, logits):
    probs = torch.softmax(logits, -1)
    ids = [e["token_id"] for e in got]
    assert [e["prob"] for e in got] == pytest.approx(probs[ids].tolist(), abs=TOL)
    assert ids == probs.topk(len(ids)).indices.tolist()


def test_a_found_set_of_heads_or_neurons_applies_unit_by_unit(unit_run):
    units, client, pre, sft, tok = unit_run
    loc = client.get("/api/localize").json()
    assert loc["units"] == units
    (search,) = loc["searches"]
    found = search["sets"][0]
    assert found["name"] == "minimal set"
    letter = "/h" if units == "head" else "/n"
    assert any(letter in c["slot"] for c in found["cells"]), "the found set holds units"
    assert found["by_unit"][units] == sum(letter in c["slot"] for c in found["cells"])
    example = loc["examples"]["qa"][0]
    toks, cells = _placed(client, example, found["cells"])
    res = client.post("/api/graft", json={"prompt": example["prompt"], "spans": example["spans"], "cells": cells,
                                          "base": "pre", "answer": example["answer"], "k": 12})
    assert res.status_code == 200, res.text
    got = res.json()
    ids = [t["token_id"] for t in toks]
    expected = _definition(pre, sft, ids, cells)
    _probs_equal(got["top"]["graft"], expected)
    answer = got["answer"]["token_id"]
    assert got["answer"]["prob"]["graft"] == pytest.approx(float(torch.softmax(expected, -1)[answer]), abs=TOL)
    # the grafted pass differs from grafting the same cells whole: the units were applied apart
    whole = [dict(c, slot=parse_cell_name(c["slot"])[0]) for c in cells]
    assert not torch.allclose(_definition(pre, sft, ids, whole), expected, atol=1e-6)
    # the map says which units of which cells: each unit cell of the set is grafted there
    shown = got["map"]["units"]
    assert sorted(got["map"]["heads" if units == "head" else "neurons"]) == sorted(shown)
    rows = {(name, t): roles for name, u in shown.items() for t, roles in u["rows"]}
    for c in cells:
        name, unit = parse_cell_name(c["slot"])
        if unit >= 0:
            assert rows[(name, c["position"])][unit] == 1 and shown[name]["kind"] == units
    if units == "head":  # wg.graft says heads with per-head rules: the same pass
        out = wg.graft({"pre": pre, "sft": sft}, tok, [example["prompt"]], _rules(cells))
        assert torch.allclose(out.logits[0], expected, atol=TOL, rtol=0)
        _probs_equal(got["top"]["graft"], out.logits[0])


def test_whole_cells_still_apply_and_later_cells_win(unit_run):
    units, client, pre, sft, tok = unit_run
    prompt = "Keanu Reeves starred in a movie with"
    ids = [t["token_id"] for t in client.post("/api/tokens", json={"prompt": prompt}).json()["tokens"]]
    last = len(ids) - 1
    unit_slot = "layers.1.o/h1" if units == "head" else "layers.1.up/n3"
    cells = [{"position": last, "slot": "layers.1.down", "model": "sft"},
             {"position": 2, "slot": "layers.0.q", "model": "sft"},
             {"position": last, "slot": unit_slot, "model": "sft"},
             {"position": last, "slot": unit_slot.split("/")[0], "model": "pre"}]  # replaces the unit cell
    res = client.post("/api/graft", json={"prompt": prompt, "cells": cells, "k": 8})
    assert res.status_code == 200, res.text
    got = res.json()
    assert got["map"]["units"] == {} and got["map"]["heads"] == [] and got["map"]["neurons"] == []
    whole = [c for c in cells[:2]]
    expected = _definition(pre, sft, ids, whole)
    _probs_equal(got["top"]["graft"], expected)
    out = wg.graft({"pre": pre, "sft": sft}, tok, [prompt], _rules(whole))
    assert torch.allclose(out.logits[0], expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("slot,needle", [
    ("layers.1.o/n2", "heads: write layers.1.o/h"),
    ("layers.1.up/h0", "neurons: write layers.1.up/n"),
    ("layers.1.o/h99", "no head 99"),
    ("embed/h0", "has no heads or neurons"),
    ("layers.1.o/x", "not a cell name"),
    ("layers.9.o/h0", "unknown slot"),
])
def test_unit_cells_that_name_no_unit_are_refused(unit_run, slot, needle):
    _, client, *_ = unit_run
    res = client.post("/api/graft", json={"prompt": "Keanu Reeves", "cells": [{"position": 0, "slot": slot, "model": "sft"}]})
    assert res.status_code == 400 and needle in res.json()["error"], res.text
    assert "\n" not in res.json()["error"]


def test_cell_maps_build_unit_rows_from_their_cell(tiny_pair):
    pre, _ = tiny_pair("llama")
    slot_list = model_slots(pre)
    index = {s.name: i for i, s in enumerate(slot_list)}
    n_heads = slot_list[index["layers.1.o"]].heads
    maps = cell_maps([Cell(position=1, slot="layers.1.o", model="sft"), Cell(position=1, slot="layers.1.o/h0", model="pre"),
                      Cell(position=2, slot="layers.1.o/h1", model="sft"), Cell(position=0, slot="layers.1.o/bias", model="sft")],
                     3, slot_list, ["pre", "sft"], "pre")
    expected = torch.zeros(3, n_heads, dtype=torch.long)
    expected[1] = 1
    expected[1, 0] = 0
    expected[2, 1] = 1
    assert torch.equal(maps.heads["layers.1.o"], expected)
    # the bias cell sets the slot's own part only; a whole cell its every unit
    assert maps.slots[:, index["layers.1.o"]].tolist() == [1, 1, 0]
    assert maps.neurons == {}
    with pytest.raises(RequestError, match="outside the prompt"):
        cell_maps([Cell(position=3, slot="layers.1.o/h0", model="sft")], 3, slot_list, ["pre", "sft"], "pre")
