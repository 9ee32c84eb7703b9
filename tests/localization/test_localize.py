"""``localize`` end to end on a tiny world: tables, search, report, resuming, config errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_world import loader, write_world

from weightgraft.api.localize import localize
from weightgraft.engine.cells import exact_effects
from weightgraft.experiments.config import ConfigError
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.examples import position_labels

COLUMNS = ["example_id", "template", "direction", "position", "position_label", "layer", "component", "estimate", "exact"]


def _config(tmp_path, **extra):
    data = write_world(tmp_path / "data", n=4)
    raw = {"name": "loc", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
           "out": str(tmp_path / "runs"), "batch_size": 3, "exact_chunk": 64, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, **extra}
    return parse_localize_config(raw)


@pytest.mark.slow
def test_localize_end_to_end(tmp_path):
    config = _config(tmp_path, ig_steps=3, exact=2, search={"target_share": 0.8})
    result = localize(config, progress=False, load=loader)
    cells = pd.read_parquet(result.run_dir / "cells.parquet")
    assert set(COLUMNS) <= set(cells.columns) and "estimate_ig" in cells
    assert set(cells["direction"]) == {"sufficiency", "necessity"}
    # exact for the first 2 examples of each template only, null elsewhere
    with_exact = cells[cells["exact"].notna()]["example_id"].unique()
    assert sorted(with_exact) == ["r0000/headline", "r0000/qa", "r0001/headline", "r0001/qa"]
    assert cells[~cells["example_id"].isin(with_exact)]["exact"].isna().all()
    # output-only slots appear at the last position only
    assert set(cells[cells["component"] == "unembed"]["position_label"]) == {"last"}
    search = json.loads((result.run_dir / "search.json").read_text())
    assert len(search["searches"]) == 4
    for entry in search["searches"]:
        sizes = [p["size"] for p in entry["curve"]]
        assert entry["size"] in sizes and sizes == sorted(sizes)
        if entry["reached"]:
            share = {p["size"]: p["share"] for p in entry["curve"]}
            assert share[entry["size"]] >= 0.8
            assert entry["size"] == 1 or share.get(entry["size"] - 1, 0) < 0.8 or entry["size"] - 1 not in share
    assert (result.run_dir / "report" / "index.html").is_file()
    assert (result.run_dir / "report" / "scatter.png").is_file()
    # claims.csv: the paper's claims as exact region grafts, per template and graft direction
    from weightgraft.localization.claims import CLAIMS, VERDICTS

    claims = pd.read_csv(result.run_dir / "claims.csv", keep_default_na=False, na_values=[""])
    assert set(claims["claim"]) == {c.name for c in CLAIMS} and len(claims) == 2 * 2 * len(CLAIMS)
    for column in ("setting", "share_exact", "ci_low", "ci_high", "share_estimate", "interaction", "null_kind",
                   "region_cells_share", "null_mean", "null_p", "threshold_p", "p", "p_parts", "p_holm", "share_plain", "evidence", "reason", "family_size"):
        assert column in claims
    assert set(claims["verdict"]) <= set(VERDICTS) and (claims["n_prompts"] == 4).all()
    # exact single-cell maps of 2 of the 4 prompts: no share of a partial sum of exact cells
    assert claims["share_exact_cells"].isna().all()
    # necessity rows and claims 4-5 on the pre->sft pair say they are outside the paper's setting
    inside = claims[claims["in_paper_setting"]]
    assert set(inside["direction"]) == {"sufficiency"} and set(inside["claim"]) == {"fe_lt", "enrichment", "recall",
                                                                                   "recall_no_unembed"}
    assert (claims["evidence"] == "exploratory").all()  # 4 prompts per map, with claims.min_prompts lowered
    per_prompt = pd.read_parquet(result.run_dir / "claims_prompts.parquet")
    assert len(per_prompt) == len(claims) * 4
    # one Holm family: every row of the run with every part of its one p
    assert (claims["family_size"] == claims["p"].notna().sum()).all()
    assert (claims["p"].isna() | (claims["p"] >= claims[["threshold_p", "null_p"]].max(axis=1) - 1e-12)).all()
    html = (result.run_dir / "report" / "index.html").read_text()
    assert "The paper's claims" in html and "recall_o_late_ffn" in html


@pytest.mark.slow
def test_search_share_is_the_exact_effect_of_the_set(tmp_path):
    config = _config(tmp_path, exact="none", graft_directions=["sufficiency"], templates=["headline"])
    result = localize(config, progress=False, load=loader)
    entry = result.search.searches[0]
    pre, sft = loader("tiny-llama:pre"), loader("tiny-llama:sft")
    from weightgraft.engine.architectures import model_slots
    from weightgraft.localization.examples import build_examples
    from weightgraft.localization.maps import cell_map
    from weightgraft.localization.prompts import select_prompts

    examples, _ = build_examples(select_prompts(config), pre.tokenizer)
    index = {s.name: i for i, s in enumerate(model_slots(pre.model))}
    maps = [cell_map(e, index, pre.model) for e in examples]
    chosen = [(c["position_label"], c["slot"]) for c in entry["cells"]]
    sets = [[[m[k] for k in chosen if k in m]] for m in maps]
    every = [[list(m.values())] for m in maps]
    models = [pre.model, sft.model]
    _, part = exact_effects(models, [e.scored for e in examples], sets, pad_id=0)
    _, whole = exact_effects(models, [e.scored for e in examples], every, pad_id=0)
    part, whole = torch.cat(part), torch.cat(whole)
    fit = torch.tensor([e.prompt.id in entry["fit_ids"] for e in examples])
    assert fit.sum() == 2 and len(entry["heldout_ids"]) == 2  # 4 prompts: 2 searched on, 2 held out
    share = float(part[fit].mean() / whole[fit].mean())
    assert share == pytest.approx(entry["share"], rel=1e-5)
    assert float(whole[fit].mean()) == pytest.approx(entry["total_effect"], rel=1e-5)
    held = float(part[~fit].mean() / whole[~fit].mean())
    assert held == pytest.approx(entry["heldout_share"], rel=1e-5)


@pytest.mark.slow
def test_rerun_reuses_finished_stages_and_resumes_a_lost_part(tmp_path):
    config = _config(tmp_path, exact="all", search={"enabled": False}, report=False)
    first = localize(config, progress=False, load=loader)
    parts = sorted((first.run_dir / "parts").glob("exact_*.parquet"))
    assert parts
    stamps = {p: p.stat().st_mtime_ns for p in parts}
    parts[-1].unlink()  # as if killed before the last group was written
    (first.run_dir / "cells.parquet").unlink()
    second = localize(config, progress=False, load=loader)
    assert all(p.stat().st_mtime_ns == stamps[p] for p in parts[:-1])
    pd.testing.assert_frame_equal(first.cells, second.cells)
    other = _config(tmp_path, exact="none", metric="neg_kl_donor")
    with pytest.raises(ValueError, match="another config"):
        localize(other, progress=False, load=loader)
    # a run whose cells are keyed by the labels before '{span}_last' (its 'first_entity' was the
    # entity's last token) is not extended with cells of today's labels
    manifest = first.run_dir / "manifest.json"
    stored = json.loads(manifest.read_text())
    assert stored["labels"] == 2
    stored.pop("labels")
    manifest.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="position labels of version 1") as err:
        localize(config, progress=False, load=loader)
    assert "\n" not in str(err.value)


def test_config_errors_before_any_model_loads(tmp_path):
    data = write_world(tmp_path / "data", n=2)
    with pytest.raises(ConfigError, match="'pre' and 'sft'"):
        parse_localize_config({"data": str(data), "models": {"pre": "x"}})
    with pytest.raises(ConfigError, match="at colour: Extra inputs"):
        parse_localize_config({"data": str(data), "models": {"pre": "x", "sft": "y"}, "colour": 1})

    def no_load(*_):
        raise AssertionError("a model was loaded")

    bad = parse_localize_config({"data": str(data), "models": {"pre": "x", "sft": "y"}, "templates": ["nope"],
                                 "out": str(tmp_path / "r")})
    with pytest.raises(ValueError, match="not in the dataset"):
        localize(bad, progress=False, load=no_load)


def test_position_labels_line_up_template_words_around_entities():
    # "AB CD starred with": entity of 2 tokens, then relation words
    offsets = [(0, 2), (3, 5), (6, 13), (14, 18)]
    labels = position_labels(offsets, {"first_actor": (0, 5), "relation": (6, 13)}, "second_actor")
    assert labels == ["first_entity_last-1", "first_entity_last", "relation_last", "last"]


def test_agreement_ranks_and_coarse_groups():
    from weightgraft.localization.agreement import agreement, span_of, spearman

    assert spearman(pd.Series([1.0, 2, 3, 4]), pd.Series([10.0, 20, 30, 100])) == pytest.approx(1.0)
    assert spearman(pd.Series([1.0, 2, 3]), pd.Series([3.0, 2, 1])) == pytest.approx(-1.0)
    # same order: exactly +-1 on every machine (pandas' float corr gave 0.9999999999999998 for
    # 11 values); exact equality is the property, computed from integer rank sums
    rng = np.random.default_rng(0)
    for n in (2, 5, 11, 12, 97):
        a = pd.Series(rng.normal(size=n))
        assert spearman(a, a * 3 + 1) == 1.0 and spearman(a, -a) == -1.0, n
        b = pd.Series(rng.normal(size=n))
        assert spearman(a, b) == pytest.approx(a.rank().corr(b.rank()), abs=1e-12)  # Pearson of the ranks
    assert [span_of(x) for x in ("first_entity_last-2", "relation_last+1", "last", "tok0", "relation_last#2")] == \
        ["first_entity", "relation", "last", "other", "relation"]
    # maps stored before the labels named a span's last token '{span}_last' group the same way
    assert [span_of(x) for x in ("first_entity-2", "first_entity", "relation+1")] == ["first_entity"] * 2 + ["relation"]
    cells = pd.DataFrame({
        "example_id": ["a"] * 4, "template": ["t"] * 4, "direction": ["sufficiency"] * 4,
        "position_label": ["first_entity_last", "first_entity_last-1", "last", "last"],
        "layer": pd.array([0, 0, 3, None], dtype="Int64"), "component": ["o", "o", "down", "unembed"],
        "estimate": [1.0, 2.0, 3.0, 4.0], "exact": [1.5, 2.5, 2.0, 5.0],
    })
    row = agreement(cells, n_layers=4, k=2).iloc[0]
    assert row["spearman_cell"] == pytest.approx(0.8)
    # groups (first_entity, q0, o), (last, q3, down), (last, unembed): 3, 3, 4 vs 4, 2, 5
    assert row["spearman_coarse"] == pytest.approx(3 ** 0.5 / 2)
    assert row["top2_overlap"] == pytest.approx(0.5)
