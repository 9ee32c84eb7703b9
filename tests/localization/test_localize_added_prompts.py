"""Prompts added to a claimed localize folder: a resumed run computes the estimates and exact
cells of exactly the prompts no part holds (and of a prompt whose scored inputs the new ones
changed: ``logit_diff``'s distractor is the next prompt's answer), reads every other prompt's
back, and ends with the maps a fresh run on all the prompts makes."""

from __future__ import annotations

import pandas as pd
import pytest
from tiny_world import loader, write_world

from weightgraft.localization import exact_parts, run
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.run import run_localize

pytestmark = pytest.mark.slow  # tiny localize runs, each over 1 s


def _config(tmp_path, n, out="run", **extra):
    raw = {"name": "grown", "data": str(write_world(tmp_path / "data", n=n)), "out": str(tmp_path / out),
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "templates": ["headline"],
           "exact": "all", "batch_size": 3, "exact_chunk": 64, "report": False, "claims": {"enabled": False},
           "search": {"enabled": False}, **extra}
    return parse_localize_config(raw)


@pytest.fixture
def computed(monkeypatch):
    """The prompts (ids) each estimates and exact pass was given, per direction."""
    calls: dict[str, list[str]] = {}

    def counting(kind, real):
        def call(models, examples, direction, **kwargs):
            calls.setdefault(f"{kind}_{direction}", []).extend(e.prompt.id for e in examples)
            return real(models, examples, direction, **kwargs)
        return call

    monkeypatch.setattr(run, "estimate_frame", counting("estimates", run.estimate_frame))
    monkeypatch.setattr(exact_parts, "exact_frame", counting("exact", exact_parts.exact_frame))
    return calls


def _same(resumed, fresh):
    """The same rows with the same values (to float32 rounding: the new prompts' gradients were
    taken in batches of other prompts than a fresh run's), whole cells in the same order; a
    prompt's unit rows are ordered by |estimate|, whose near-zero ties the batches order either way."""
    whole = resumed["unit"] == -1
    pd.testing.assert_series_equal(whole, fresh["unit"] == -1)
    keys = ["model", "direction", "template", "example_id", "position", "slot", "unit"]
    for a, b in ((resumed[whole], fresh[whole]),
                 (resumed[~whole].sort_values(keys), fresh[~whole].sort_values(keys))):
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False,
                                      rtol=1e-5, atol=1e-6)


def _ids(*numbers):
    return sorted(f"r{i:04d}/headline" for i in numbers)


@pytest.mark.parametrize(("extra", "again"), [
    ({}, ()),
    ({"metric": "logit_diff"}, (3,)),  # the last old prompt's distractor is now the first new prompt's answer
    ({"units": "head", "exact_units": 4}, ()),
])
def test_prompts_added_to_a_folder_get_maps_and_the_others_are_read_back(tmp_path, computed, extra, again):
    first = run_localize(_config(tmp_path, 4, **extra), progress=False, load=loader)
    assert {k: sorted(v) for k, v in computed.items()} == {
        f"{kind}_{d}": _ids(0, 1, 2, 3) for kind in ("estimates", "exact") for d in ("sufficiency", "necessity")}
    parts = first.run_dir / "parts"
    stamps = {p: p.stat().st_mtime_ns for p in parts.glob("*.parquet")}
    computed.clear()

    grown = run_localize(_config(tmp_path, 6, **extra), progress=False, load=loader)
    new = _ids(4, 5, *again)
    assert {k: sorted(v) for k, v in computed.items()} == {
        f"{kind}_{d}": new for kind in ("estimates", "exact") for d in ("sufficiency", "necessity")}
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # every file written before is read, not rewritten
    added = sorted(p.name for p in set(parts.glob("*.parquet")) - set(stamps))
    assert added == ["estimates_necessity_0000.parquet", "estimates_sufficiency_0000.parquet",
                     "exact_necessity_0001.parquet", "exact_sufficiency_0001.parquet"]
    assert sorted(set(grown.cells["example_id"])) == _ids(*range(6))
    whole = grown.cells[grown.cells["unit"] == -1]  # unit cells: only each prompt's top few are mapped exactly
    assert whole["estimate"].notna().all() and whole["exact"].notna().all()

    fresh = run_localize(_config(tmp_path, 6, out="fresh", **extra), progress=False, load=loader)
    _same(grown.cells, fresh.cells)
    _same(pd.read_parquet(grown.run_dir / "cells.parquet"), pd.read_parquet(fresh.run_dir / "cells.parquet"))

    computed.clear()  # the grown folder resumed as it is: nothing computed
    again_run = run_localize(_config(tmp_path, 6, **extra), progress=False, load=loader)
    assert computed == {}
    _same(again_run.cells, fresh.cells)


def test_fewer_prompts_than_the_folder_holds_map_only_those(tmp_path, computed):
    """A rerun on part of the folder's prompts (the claim lets a list be shorter) returns their
    rows only, as a fresh run on them does; nothing is computed."""
    run_localize(_config(tmp_path, 6), progress=False, load=loader)
    computed.clear()
    fewer = run_localize(_config(tmp_path, 4), progress=False, load=loader)
    assert computed == {}
    fresh = run_localize(_config(tmp_path, 4, out="fresh"), progress=False, load=loader)
    _same(fewer.cells, fresh.cells)


def test_prompts_added_to_a_folder_are_judged_by_its_claims(tmp_path):
    """The claims' parts are keyed by the prompts they judge: added prompts judge them again, on
    every prompt; the same prompts read them back."""
    claims = {"enabled": True, "null_draws": 3, "resamples": 99, "min_prompts": 2}
    one = {"graft_directions": ["sufficiency"]}
    first = run_localize(_config(tmp_path, 4, claims=claims, **one), progress=False, load=loader)
    assert set(pd.read_csv(first.run_dir / "claims.csv")["n_prompts"]) == {4}
    run_localize(_config(tmp_path, 6, claims=claims, **one), progress=False, load=loader)
    assert set(pd.read_csv(first.run_dir / "claims.csv")["n_prompts"]) == {6}
    judged = pd.read_parquet(first.run_dir / "claims_prompts.parquet")
    assert sorted(set(judged["prompt_id"])) == _ids(*range(6))
    parts = {p: p.stat().st_mtime_ns for p in (first.run_dir / "parts").glob("claims_*")}
    run_localize(_config(tmp_path, 6, claims=claims, **one), progress=False, load=loader)
    assert {p: p.stat().st_mtime_ns for p in (first.run_dir / "parts").glob("claims_*")} == parts
