"""The localize plan times the minimal graft search (issue 40): its exact set grafts per fit and
held-out prompt, from the search settings; nothing where the search is off."""

from __future__ import annotations

from pathlib import Path

from tiny_world import write_world

from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.run import plan_input
from weightgraft.planning.localize import plan_localize_work


def _plan(raw: dict):
    return plan_localize_work(plan_input(parse_localize_config(raw)))


def test_the_search_is_a_timed_part_that_grows_with_its_settings(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> None:
    raw = {"data": str(write_world(tmp_path / "data")), "out": str(tmp_path / "loc"), "exact": "none",
           "models": {"pre": str(tiny_model_dirs["pre"]), "sft": str(tiny_model_dirs["sft"])},
           "graft_directions": ["sufficiency"], "claims": {"enabled": False},
           "search": {"max_cells": 64, "controls": 20, "missed_sample": 8, "refine": True, "refine_rounds": 3}}
    work = plan_input(parse_localize_config(raw))
    assert work.search_fit_prompts and work.search_heldout_prompts
    # 16 prefix sizes then x1.25 steps to 64, the bisection, 3 halving rounds, 2 x 20 controls of 2 sets, 16 missed
    rounds = (64 + 7) + (32 + 6) + (16 + 5)
    assert work.search_fit_sets == len([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 25, 31, 38, 47, 58, 64]) \
        + 7 + rounds + 80 + 16
    assert work.search_heldout_sets == 2 + 80
    full = _plan(raw)
    fewer = _plan({**raw, "search": {**raw["search"], "refine": False}})
    smaller = _plan({**raw, "search": {**raw["search"], "max_cells": 16}})
    off = _plan({**raw, "search": {"enabled": False}})
    assert full.time_parts["search"] > fewer.time_parts["search"] > 0
    assert full.time_parts["search"] > smaller.time_parts["search"] > 0
    assert "search" not in off.time_parts
    assert any(n.startswith("search: up to 64 cells verified on") for n in full.notes)
    both = _plan({**raw, "graft_directions": ["sufficiency", "necessity"]})
    assert both.time_parts["search"] > 1.9 * full.time_parts["search"]
