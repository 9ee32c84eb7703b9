"""``units: head`` and ``units: neuron`` in ``weightgraft localize`` on a tiny pair, end to end:
unit rows sum to their cells, exact unit rows are the engine's grafts, found sets of heads and
neurons regraft to their recorded shares, controls draw unit cells; bad settings refused."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from tiny_world import loader64, write_world

from weightgraft.api.localize import localize
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.cells import WHOLE, Cell, exact_effects, parse_cell_name
from weightgraft.experiments.config import ConfigError
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.examples import build_examples
from weightgraft.localization.maps import UnitCellMap, cell_map, whole_cells
from weightgraft.localization.prompts import select_prompts

TOL = 1e-12  # float64 models


def _run(tmp, units: str, **extra):
    raw = {"name": units, "data": str(write_world(tmp / "data", n=4)), "out": str(tmp / units),
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "templates": ["headline"],
           "graft_directions": ["sufficiency"], "exact": 1, "batch_size": 4, "exact_chunk": 64,
           "report": False, "units": units, "exact_units": 8, "dtype": "float64",
           "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"target_share": 0.5, "max_cells": 256, "controls": 20, "missed_sample": 8, "refine_rounds": 3},
           **extra}
    config = parse_localize_config(raw)
    return config, localize(config, progress=False, load=loader64)


SLOW_FIXTURES = ("finished",)  # its tests are `slow` (tests/conftest.py): localize by heads, then by neurons


@pytest.fixture(scope="module", params=["head", "neuron"])
def finished(request, tmp_path_factory):
    config, result = _run(tmp_path_factory.mktemp(request.param), request.param)
    pre, sft = loader64("tiny-llama:pre"), loader64("tiny-llama:sft")
    examples, _ = build_examples(select_prompts(config), pre.tokenizer)
    return request.param, config, result, examples, pre.model, sft.model


def test_unit_rows_sum_to_their_cells_and_exact_unit_rows_are_grafts(finished):
    units, config, result, examples, pre, sft = finished
    cells = result.cells
    assert "unit" in cells and (cells["unit"] == WHOLE).any() and (cells["unit"] >= 0).any()
    split = {s.name: s.units(units) for s in model_slots(pre) if s.units(units)}
    assert set(cells.loc[cells["unit"] >= 0, "slot"]) <= set(split)
    # with few units every unit row is kept: a split slot's units sum to its whole cell row
    e = examples[0]
    rows = cells[(cells["example_id"] == e.prompt.id) & (cells["template"] == e.prompt.template)]
    whole = rows[rows["unit"] == WHOLE].set_index(["position", "slot"])["estimate"]
    parts = rows[rows["unit"] != WHOLE].groupby(["position", "slot"])["estimate"].sum()
    joined = pd.concat([whole.loc[parts.index], parts], axis=1)
    assert len(joined) == (e.scored.position + 1) * len(split)
    assert (joined.iloc[:, 0] - joined.iloc[:, 1]).abs().max() < 1e-5
    # exact unit rows (the prompt's top exact_units by |estimate|) equal the engine's graft
    exact_units = rows[(rows["unit"] != WHOLE) & rows["exact"].notna()]
    assert len(exact_units) == config.exact_units
    index = {s.name: i for i, s in enumerate(model_slots(pre))}
    chosen = exact_units.head(3)
    sets = [[Cell(int(t), index[s], int(u))] for t, s, u in zip(chosen["position"], chosen["slot"], chosen["unit"])]
    _, (eff,) = exact_effects([pre, sft], [e.scored], [sets], pad_id=0)
    assert torch.allclose(eff.double(), torch.tensor(chosen["exact"].to_numpy(), dtype=torch.float64), atol=TOL)
    # the whole-cell map is the map of a cell run: one row per cell
    assert len(whole_cells(rows)) == len(cell_map(e, index, pre))


def _share(models, examples, maps, whole, keys) -> float:
    sets = [[[m[k] for k in keys if k in m], list(w.values())] for m, w in zip(maps, whole)]
    _, eff = exact_effects(models, [e.scored for e in examples], sets, pad_id=0)
    eff = torch.stack(eff)
    return float(eff[:, 0].mean() / eff[:, 1].mean())


def test_found_sets_of_units_regraft_to_their_shares(finished):
    units, config, result, everything, pre, sft = finished
    index = {s.name: i for i, s in enumerate(model_slots(pre))}
    (entry,) = result.search.searches
    examples = [e for e in everything if e.prompt.id in entry["fit_ids"]]  # searched on these only
    held = [e for e in everything if e.prompt.id in entry["heldout_ids"]]
    whole = [cell_map(e, index, pre) for e in examples]
    keys = [(c["position_label"], c["slot"]) for c in entry["cells"]]
    drawn = [tuple(c) for s in entry["controls"]["random"]["sets"] for c in s["cells"]]
    assert any("/" in name for _, name in keys + drawn), "found sets and controls hold heads or neurons"
    for _, name in keys:
        slot, unit = parse_cell_name(name)
        assert slot in index and (unit == WHOLE) == (model_slots(pre)[index[slot]].units(units) == 0)
    universe = sorted({tuple(k) for k in keys})
    maps = [UnitCellMap(e, index, pre, universe) for e in examples]
    assert _share([pre, sft], examples, maps, whole, keys) == pytest.approx(entry["share"], abs=TOL)
    held_maps = [UnitCellMap(e, index, pre, universe) for e in held]
    held_whole = [cell_map(e, index, pre) for e in held]
    assert _share([pre, sft], held, held_maps, held_whole, keys) == pytest.approx(entry["heldout_share"], abs=TOL)
    refined = [(c["position_label"], c["slot"]) for c in entry["refined"]["cells"]]
    assert _share([pre, sft], examples, maps, whole, refined) == pytest.approx(entry["refined"]["share"], abs=TOL)
    for s in entry["controls"]["random"]["sets"][:2]:
        cells = [tuple(c) for c in s["cells"]]
        cmaps = [UnitCellMap(e, index, pre, cells) for e in examples]
        assert _share([pre, sft], examples, cmaps, whole, cells) == pytest.approx(s["share"], abs=TOL)


def test_units_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="units"):
        parse_localize_config({"data": "x", "models": {"pre": "a", "sft": "b"}, "units": "layer"})
    with pytest.raises(ConfigError, match="unit_rows"):
        parse_localize_config({"data": "x", "models": {"pre": "a", "sft": "b"}, "unit_rows": 0})


def test_report_and_explore_read_a_unit_run(finished):
    from weightgraft.explore.artifacts import LocalizeView
    from weightgraft.report.localize import write_localize_report

    units, config, result, examples, pre, sft = finished
    page = write_localize_report(result.run_dir).read_text()
    assert "Heads and neurons" in page and f"units: {units}" in page
    assert ("/h" if units == "head" else "/n") in page
    view = LocalizeView(result.run_dir).to_json()
    (search,) = view["searches"]
    assert view["units"] == units
    # sets of heads or neurons are offered as they are (explore applies them unit by unit), counted
    letter = "/h" if units == "head" else "/n"
    for s in search["sets"]:
        assert s["by_unit"].get(units, 0) == sum(letter in c["slot"] for c in s["cells"])
    assert any(s["by_unit"] for s in search["sets"]), "some set holds heads or neurons"
    n_maps = sum(len(v) for m in view["maps"] for v in m["values"].values())
    assert n_maps == len(whole_cells(result.cells).groupby(["position_label", "slot"])) * len(view["columns"])
