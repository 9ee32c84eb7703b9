"""Localize's search and stability as keyed stages of its folder (``stages.json``): a resumed run
with the same inputs reads ``search.json`` and ``stability.csv`` back without computing them,
and a changed input (other maps, prompts added: their estimates and cells join the maps) computes
again only what depends on it."""

from __future__ import annotations

import json

import pytest
from tiny_world import loader, write_world

from weightgraft.api.localize import localize
from weightgraft.localization import found_sets, stability
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.maps import whole_cells
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import FolderStages, SearchRecord
from weightgraft.resume.stages import frame_digest

pytestmark = pytest.mark.slow  # tiny localize runs, each over 1 s


def _config(tmp_path, n=4, **extra):
    raw = {"name": "keyed", "data": str(write_world(tmp_path / "data", n=n)), "out": str(tmp_path / "run"),
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "templates": ["headline"],
           "graft_directions": ["sufficiency"], "exact": "none", "batch_size": 3, "exact_chunk": 64,
           "report": False, "claims": {"enabled": False},
           "search": {"target_share": 0.8, "controls": 0, "missed_sample": 0, "refine": False}, **extra}
    return parse_localize_config(raw)


@pytest.fixture
def counted(monkeypatch):
    """How many times the search and the stability table were computed."""
    calls = {"search": 0, "stability": 0}

    def counting(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(found_sets, "minimal_graft_search", counting("search", found_sets.minimal_graft_search))
    monkeypatch.setattr(stability, "stability_table", counting("stability", stability.stability_table))
    return calls


def _stamps(run_dir):
    names = ("search.json", "stability.csv", "stability_null.csv")
    return {name: (run_dir / name).stat().st_mtime_ns for name in names}


def test_a_resumed_localize_reads_its_search_and_stability_back(tmp_path, counted):
    first = localize(_config(tmp_path), progress=False, load=loader)
    assert counted == {"search": 1, "stability": 1}
    stages = RunFolder(first.run_dir).read(FolderStages)
    assert stages is not None and set(stages.stages) == {"search", "stability"}
    stamps = _stamps(first.run_dir)

    again = localize(_config(tmp_path), progress=False, load=loader)
    assert counted == {"search": 1, "stability": 1}  # nothing computed again
    assert _stamps(first.run_dir) == stamps
    assert again.search == first.search and again.search.model == "sft" and again.search.searches
    assert RunFolder(first.run_dir).read(SearchRecord) == first.search  # the typed reader reads the file as written
    assert json.loads((first.run_dir / "search.json").read_text())["searches"] == first.search.searches


def test_a_changed_input_computes_again_what_depends_on_it(tmp_path, counted):
    first = localize(_config(tmp_path), progress=False, load=loader)
    keys = {n: s.key for n, s in RunFolder(first.run_dir).read(FolderStages).stages.items()}

    localize(_config(tmp_path, exact=1), progress=False, load=loader)  # exact maps: other maps, the same estimates
    assert counted == {"search": 1, "stability": 2}  # the search ranks by estimates: kept
    now = {n: s.key for n, s in RunFolder(first.run_dir).read(FolderStages).stages.items()}
    assert now["search"] == keys["search"] and now["stability"] != keys["stability"]

    more = localize(_config(tmp_path, n=6, exact=1), progress=False, load=loader)  # prompts added to the data
    assert counted == {"search": 2, "stability": 3}  # both again: the maps now hold the new prompts' cells
    after = {n: s.key for n, s in RunFolder(first.run_dir).read(FolderStages).stages.items()}
    assert after["search"] != now["search"] and after["stability"] != now["stability"]
    split = more.search.splits["headline"]
    assert len(split["fit_ids"]) + len(split["heldout_ids"]) == 6
    mapped = set(more.cells.loc[more.cells["estimate"].notna(), "example_id"])
    assert set(split["fit_ids"]) | set(split["heldout_ids"]) == mapped  # every prompt searched has its map
    stages = RunFolder(first.run_dir).read(FolderStages).stages
    assert stages["stability"].inputs["maps"] == frame_digest(whole_cells(more.cells))  # keyed by the grown maps

    localize(_config(tmp_path, n=6, exact=1), progress=False, load=loader)
    assert counted == {"search": 2, "stability": 3}  # and read back once they are recorded


def test_a_search_stopped_midway_resumes_from_its_file(tmp_path, counted):
    first = localize(_config(tmp_path), progress=False, load=loader)
    folder = RunFolder(first.run_dir)
    folder.write(FolderStages())  # as if stopped before the stages were recorded: search.json's entries stand
    localize(_config(tmp_path), progress=False, load=loader)
    assert counted["search"] == 1  # its entry, searched on the same fit prompts, kept
    assert set(folder.read(FolderStages).stages) == {"search", "stability"}
