"""``localize`` on own data, the way ``run`` reads it: a free-form JSONL, ``exact:`` raised on a
finished run extends it, ``out`` is the run directory, the trained direction by default, and
the CLI with ``report: false`` names no report that does not exist."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from tiny_world import FIRST, SECOND, TEMPLATES, loader, write_world
from typer.testing import CliRunner

from weightgraft.api.localize import localize
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.prompts import choose_directions, select_prompts

MODELS = {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}


def _freeform(path, n=4):
    lines = []
    for i in range(n):
        prompt = TEMPLATES["headline"].format(first_actor=FIRST[i])
        lines.append({"prompt": prompt, "answer": SECOND[i], "spans": {"subject": FIRST[i], "relation": "starred in a movie"}})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.mark.slow
def test_a_freeform_jsonl_that_run_accepts(tmp_path):
    data = _freeform(tmp_path / "own.jsonl")
    config = parse_localize_config({"data": str(data), "models": MODELS, "out": str(tmp_path / "run"),
                                    "exact": 1, "report": False, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"controls": 0, "missed_sample": 0}})
    result = localize(config, progress=False, load=loader)
    assert set(result.cells["template"]) == {"freeform"}
    assert result.cells["example_id"].nunique() == 4
    assert result.cells.loc[result.cells["example_id"] == "line1", "exact"].notna().all()
    assert result.cells.loc[result.cells["example_id"] == "line2", "exact"].isna().all()
    # the subject span is the first entity: its last token is labelled so
    assert "first_entity_last" in set(result.cells["position_label"])
    assert result.search.searches[0]["refined"]["size"] <= result.search.searches[0]["size"]


@pytest.mark.slow
def test_raising_exact_extends_a_finished_run(tmp_path):
    data = write_world(tmp_path / "data", n=4)
    base = {"data": str(data), "models": MODELS, "batch_size": 3, "exact_chunk": 64, "report": False,
            "graft_directions": ["sufficiency"], "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"enabled": False}}
    first = localize(parse_localize_config({**base, "exact": 1, "out": str(tmp_path / "a")}), progress=False, load=loader)
    parts = sorted((first.run_dir / "parts").glob("exact_*.parquet"))
    stamps = {p: p.stat().st_mtime_ns for p in parts}
    second = localize(parse_localize_config({**base, "exact": 2, "out": str(tmp_path / "a")}), progress=False, load=loader)
    assert all(p.stat().st_mtime_ns == stamps[p] for p in parts)  # nothing recomputed
    new = sorted(set((first.run_dir / "parts").glob("exact_*.parquet")) - set(parts))
    held = set().union(*(set(pd.read_parquet(p)["example_id"]) for p in new))
    assert held == {"r0001/headline", "r0001/qa"}  # only the added prompts were computed
    fresh = localize(parse_localize_config({**base, "exact": 2, "out": str(tmp_path / "b")}), progress=False, load=loader)
    key = ["example_id", "template", "direction", "position", "slot"]
    a = second.cells.sort_values(key).reset_index(drop=True)
    b = fresh.cells.sort_values(key).reset_index(drop=True)
    # the same cells, the same exact effects (to float32 batch-composition noise)
    pd.testing.assert_frame_equal(a.drop(columns="exact"), b.drop(columns="exact"))
    assert (a["exact"].isna() == b["exact"].isna()).all()
    assert (a["exact"] - b["exact"]).abs().max() < 1e-5
    # lowering it again reuses the parts: exact only on the first prompt of each template
    third = localize(parse_localize_config({**base, "exact": 1, "out": str(tmp_path / "a")}), progress=False, load=loader)
    assert sorted(third.cells.loc[third.cells["exact"].notna(), "example_id"].unique()) == ["r0000/headline", "r0000/qa"]
    # another setting that changes every number is still refused
    with pytest.raises(ValueError, match="another config"):
        localize(parse_localize_config({**base, "exact": 1, "metric": "neg_kl_donor", "out": str(tmp_path / "a")}),
                 progress=False, load=loader)


def test_changed_prompt_content_is_refused(tmp_path):
    data = write_world(tmp_path / "data", n=3)
    raw = {"data": str(data), "models": MODELS, "out": str(tmp_path / "run"), "exact": "none", "report": False,
           "graft_directions": ["sufficiency"], "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"enabled": False}}
    localize(parse_localize_config(raw), progress=False, load=loader)
    path = data / "test_prompts.jsonl"
    path.write_text(path.read_text().replace("Keanu Reeves", "Keanu Reves"))
    with pytest.raises(ValueError, match="content has changed"):
        localize(parse_localize_config(raw), progress=False, load=loader)


def test_out_is_the_run_directory_as_in_run(tmp_path, monkeypatch):
    data = str(write_world(tmp_path / "data", n=2))
    assert parse_localize_config({"name": "x", "data": data, "models": MODELS, "out": str(tmp_path / "here")}).run_dir() \
        == tmp_path / "here"
    monkeypatch.chdir(tmp_path)
    assert str(parse_localize_config({"name": "x", "data": data, "models": MODELS}).run_dir()) == "runs/x"


def _two_directions(data_dir, manifest):
    write_world(data_dir, n=3)
    path = data_dir / "test_prompts.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows += [{**r, "id": r["id"] + "/rev", "direction": "b2a"} for r in rows]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if manifest is not None:
        (data_dir / "manifest.json").write_text(json.dumps(manifest))
    return data_dir


def test_the_trained_direction_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))
    data = _two_directions(tmp_path / "data", {"directions": ["a2b"]})
    config = parse_localize_config({"data": str(data), "models": MODELS})
    assert {p.direction for p in select_prompts(config)} == {"a2b"}
    assert "manifest.json" in choose_directions(config).note
    from weightgraft.data.freeform import load_prompts
    from weightgraft.localization.prompts import left_out, localize_prompts

    assert left_out(config, choose_directions(config), load_prompts(config.data)) == 6  # 3 relations x 2 templates, b2a
    assert "(6 prompt(s) of other directions left out)" in localize_prompts(config).choice.note  # counted, said
    # the SFT model's training manifest comes first
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "training_manifest.json").write_text(json.dumps({"data": {"split": "b2a"}}))
    config = parse_localize_config({"data": str(data), "models": {"pre": "p", "sft": str(sft)}})
    assert {p.direction for p in select_prompts(config)} == {"b2a"}
    assert "training split" in choose_directions(config).note
    # `demo` names the demo's finetune folder: its training split, as for the folder itself
    from weightgraft.models.demo_models import write_demo_record

    (sft / "config.json").write_text("{}")  # a model folder to the demo's record
    write_demo_record("smollm2-135m", sft, tmp_path)
    config = parse_localize_config({"data": str(data), "models": {"pre": "p", "sft": "demo"}})
    assert choose_directions(config).directions == ["b2a"] and str(sft) in choose_directions(config).note
    # named in the config: as named
    config = parse_localize_config({"data": str(data), "models": {"pre": "p", "sft": str(sft)}, "directions": ["a2b", "b2a"]})
    assert {p.direction for p in select_prompts(config)} == {"a2b", "b2a"}
    # nothing says: every prompt, and the note says so
    bare = _two_directions(tmp_path / "bare", None)
    config = parse_localize_config({"data": str(bare), "models": MODELS})
    assert {p.direction for p in select_prompts(config)} == {"a2b", "b2a"}
    assert "every prompt" in choose_directions(config).note


@pytest.mark.slow
@pytest.mark.parametrize("report", [False, True])
def test_cli_names_a_report_only_when_there_is_one(tmp_path, monkeypatch, report):
    import weightgraft.api.pipelines as loc
    from weightgraft.cli import app

    real = loc.run_localize  # the CLI's call, with tiny models; the page is still drawn by the front door
    monkeypatch.setattr(loc, "run_localize",
                        lambda cfg, progress=True, load=None: real(cfg, progress=False, load=loader))
    cfg = tmp_path / "loc.yaml"
    cfg.write_text(yaml.safe_dump({"data": str(write_world(tmp_path / "data", n=3)), "models": MODELS,
                                   "out": str(tmp_path / "run"), "exact": "none", "report": report,
                                   "templates": ["headline"], "graft_directions": ["sufficiency"],
                                   "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"controls": 0, "missed_sample": 0}}))
    out = CliRunner().invoke(app, ["localize", str(cfg)], catch_exceptions=False).output
    page = tmp_path / "run" / "report" / "index.html"
    assert page.is_file() == report
    assert (f"report: {page}" in out.replace("\n", "")) == report
    assert "directions:" in out and "refined by exact marginal gain" in out
    flat = out.replace("\n", "")
    assert "claim recall_no_unembed (pre->sft):" in flat and "exact share" in flat and "its null:" in flat
    assert "held-out prompts' effect" in flat  # the found set's share on prompts the search never saw
