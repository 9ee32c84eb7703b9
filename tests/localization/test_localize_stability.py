"""Several SFT models in one localize run, and ``stability.csv``: config forms and refusals
before loading, one table with a ``model`` column, the search on the first SFT model only,
appending SFT models extends a run, stability values recomputed here from ``cells.parquet``,
identical SFT models agree exactly, the report's stability section, explore's first map."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from tiny_world import loader, write_world

from weightgraft.api.localize import localize
from weightgraft.experiments.config import ConfigError
from weightgraft.localization.config import parse_localize_config

SFTS = ["tiny-llama:sft", "tiny-llama:task", "tiny-llama:sft-copy"]  # the third: the first's weights again


def copy_loader(spec: str, config=None):
    """``tiny-llama:sft-copy``: the same weights as ``tiny-llama:sft`` under another spec."""
    return loader("tiny-llama:sft" if spec == "tiny-llama:sft-copy" else spec, config)


def no_load(*_):
    raise AssertionError("a model was loaded")


def _raw(tmp_path, sft, **extra):
    return {"name": "stab", "data": str(write_world(tmp_path / "data", n=4)), "out": str(tmp_path / "run"),
            "models": {"pre": "tiny-llama:pre", "sft": sft}, "batch_size": 3, "exact_chunk": 64, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, **extra}


# ------------------------------------------------------------------ independent recomputation

def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(np.asarray(a)), _ranks(np.asarray(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra ** 2).sum() * (rb ** 2).sum()))


def _span(label: str) -> str:
    """The span group, written out another way: strip a ``#n``, then a trailing ``-k`` / ``+k``,
    then the ``_last`` that names a span's last token."""
    base = label.partition("#")[0]
    if base.startswith("tok") and base[3:].isdigit():
        return "other"
    head, sign, tail = max(base.rpartition("-"), base.rpartition("+"), key=lambda p: len(p[0]))
    if not (sign and tail.isdigit()):
        head, sign = base, ""
    head = head[: -len("_last")] if head.endswith("_last") else head
    return head + ("+" if sign == "+" else "")


def test_span_groups_keep_the_words_after_a_span_apart():
    from weightgraft.localization.stability import span_group

    labels = ["first_entity_last-2", "first_entity_last", "first_entity_last+3", "tok0", "relation_last#2",
              "relation_preposition_last+1", "last", "my-span_last", "my-span_last-1",
              "first_entity-2", "first_entity", "relation+1"]  # the last three: labels of maps stored before '_last'
    want = ["first_entity", "first_entity", "first_entity+", "other", "relation", "relation_preposition+", "last",
            "my-span", "my-span", "first_entity", "first_entity", "relation+"]
    assert [span_group(x) for x in labels] == want == [_span(x) for x in labels]


def _maps(cells: pd.DataFrame, column: str, n_layers: int) -> tuple[dict, dict]:
    """(span, quarter, component) and (label, slot) -> sum of |value| / prompts, row by row."""
    n = cells["example_id"].nunique()
    coarse: dict = {}
    fine: dict = {}
    for r in cells.itertuples():
        quarter = -1 if pd.isna(r.layer) else int(r.layer) * 4 // n_layers
        v = abs(getattr(r, column)) / n
        coarse[(_span(r.position_label), quarter, r.component)] = coarse.get((_span(r.position_label), quarter, r.component), 0.0) + v
        fine[(r.position_label, r.slot)] = fine.get((r.position_label, r.slot), 0.0) + v
    return coarse, fine


def _expected(a: pd.DataFrame, b: pd.DataFrame, n_layers: int) -> dict:
    exact = a["exact"].notna().all() and b["exact"].notna().all()
    column = "exact" if exact else "estimate"
    (ca, fa), (cb, fb) = _maps(a, column, n_layers), _maps(b, column, n_layers)
    bins = sorted(set(ca) | set(cb), key=str)
    k = min(50, len(fa), len(fb))
    top = lambda f: {key for key, _ in sorted(f.items(), key=lambda kv: -kv[1])[:k]}  # noqa: E731
    return {"value": column, "n_bins": len(bins),
            "spearman_coarse": _spearman([ca.get(x, 0.0) for x in bins], [cb.get(x, 0.0) for x in bins]),
            "top_k": k, "top_overlap": len(top(fa) & top(fb)) / k}


def _check_table(cells: pd.DataFrame, table: pd.DataFrame) -> int:
    """Every row of ``stability.csv`` against the recomputation; every pair present. Returns rows."""
    n_layers = int(cells["layer"].max()) + 1
    models = list(dict.fromkeys(cells["model"]))
    templates = list(dict.fromkeys(cells["template"]))
    directions = list(dict.fromkeys(cells["direction"]))
    want = {("sft", d, ma, t, mb, t) for d in directions for t in templates for ma, mb in combinations(models, 2)}
    want |= {("template", d, m, ta, m, tb) for d in directions for m in models for ta, tb in combinations(templates, 2)}
    got = set(zip(table["kind"], table["direction"], table["model_a"], table["template_a"], table["model_b"], table["template_b"]))
    assert got == want and len(table) == len(want)
    for r in table.itertuples():
        pick = lambda m, t, r=r: cells[(cells["model"] == m) & (cells["template"] == t) & (cells["direction"] == r.direction)]  # noqa: E731
        exp = _expected(pick(r.model_a, r.template_a), pick(r.model_b, r.template_b), n_layers)
        assert r.value == exp["value"] and r.n_bins == exp["n_bins"] and r.top_k == exp["top_k"]
        assert r.spearman_coarse == pytest.approx(exp["spearman_coarse"], abs=1e-9)
        assert r.top_overlap == pytest.approx(exp["top_overlap"], abs=1e-12)
    return len(table)


# ------------------------------------------------------------------ config forms

def test_sft_list_forms_and_refusals_before_loading(tmp_path):
    one = parse_localize_config(_raw(tmp_path, "tiny-llama:sft"))
    assert one.sft_models() == [("sft", "tiny-llama:sft")]
    many = parse_localize_config(_raw(tmp_path, SFTS))
    assert many.sft_models() == list(zip(["sft[0]", "sft[1]", "sft[2]"], SFTS))
    assert many.roles() == {"pre": "tiny-llama:pre", "sft[0]": SFTS[0], "sft[1]": SFTS[1], "sft[2]": SFTS[2]}
    # the identity holds the first SFT model only: appending to the list extends a run
    assert many.identity() == one.identity()
    assert parse_localize_config(_raw(tmp_path, SFTS[1:])).identity() != one.identity()
    for bad, message in (([], "non-empty list"), (["a", "a"], "lists 'a' more than once"), (["a", 3], "non-empty list"),
                         ({"x": 1}, "one model spec")):
        with pytest.raises(ConfigError, match=message) as err:
            parse_localize_config(_raw(tmp_path, bad))
        assert len(str(err.value).splitlines()) == 1  # the file and the problem, in one line
    with pytest.raises(ConfigError, match="models.pre: one model spec"):
        parse_localize_config({**_raw(tmp_path, "x"), "models": {"pre": ["a", "b"], "sft": "x"}})
    # a LoRA donor in the list must sit on pre: refused before anything loads
    bad = parse_localize_config(_raw(tmp_path, ["tiny-llama:sft", "peft(sft, /nowhere)"]))
    with pytest.raises(Exception, match="peft|adapter|role") as err:
        localize(bad, progress=False, load=no_load)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ three SFT models, two templates

SLOW_FIXTURES = ("multi",)  # its tests are `slow` (tests/conftest.py): localize over several SFT models


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi")
    raw = _raw(tmp, SFTS, exact=1, search={"target_share": 0.8, "controls": 0, "missed_sample": 0, "refine": False})
    result = localize(parse_localize_config(raw), progress=False, load=copy_loader)
    return result


def test_each_sft_model_has_its_maps_in_one_table(multi):
    cells = pd.read_parquet(multi.run_dir / "cells.parquet")
    assert list(dict.fromkeys(cells["model"])) == ["sft[0]", "sft[1]", "sft[2]"]
    keys = ["template", "direction", "example_id", "position", "slot"]
    by = {m: g.drop(columns="model").sort_values(keys).reset_index(drop=True) for m, g in cells.groupby("model")}
    assert len(by["sft[0]"]) == len(by["sft[1]"]) == len(by["sft[2]"])
    pd.testing.assert_frame_equal(by["sft[0]"], by["sft[2]"])  # the same weights: the same maps
    assert not np.allclose(by["sft[0]"]["estimate"], by["sft[1]"]["estimate"])
    # exact for the first prompt of each template, for every SFT model
    assert cells.groupby("model")["exact"].apply(lambda s: s.notna().sum()).nunique() == 1
    assert cells["exact"].notna().any() and cells["exact"].isna().any()
    manifest = json.loads((multi.run_dir / "manifest.json").read_text())
    assert manifest["sft_models"] == ["sft[0]", "sft[1]", "sft[2]"] and manifest["search_model"] == "sft[0]"
    assert {m: manifest["models"][m]["spec"] for m in ("sft[0]", "sft[1]", "sft[2]")} == dict(zip(["sft[0]", "sft[1]", "sft[2]"], SFTS))
    search = json.loads((multi.run_dir / "search.json").read_text())
    assert search["model"] == "sft[0]" and len(search["searches"]) == 4  # (2 directions x 2 templates), once
    assert (multi.run_dir / "parts" / "sft1" / "estimates_sufficiency.parquet").is_file()
    assert (multi.run_dir / "parts" / "sft2" / "estimates_necessity.parquet").is_file()


def test_stability_csv_recomputed_from_cells(multi):
    cells = pd.read_parquet(multi.run_dir / "cells.parquet")
    table = pd.read_csv(multi.run_dir / "stability.csv")
    assert _check_table(cells, table) == 2 * 2 * 3 + 2 * 3  # sft pairs per (direction, template), template pairs per (direction, model)
    assert set(table["value"]) == {"estimate"}  # exact maps cover one prompt per template only
    same = table[(table["kind"] == "sft") & (table["model_a"] == "sft[0]") & (table["model_b"] == "sft[2]")]
    assert len(same) == 4
    # maps equal to float noise (batch composition moves float32 sums), so a tolerance
    np.testing.assert_allclose(same[["spearman_coarse", "top_overlap"]].to_numpy(), 1.0, rtol=0, atol=1e-12)
    assert (same["top_k"] == 50).all()
    other = table[(table["kind"] == "sft") & (table["model_b"] == "sft[1]")]
    assert (other["spearman_coarse"] < 1.0).all()  # another donor: not the same map


def test_report_has_a_stability_section(multi):
    text = (multi.run_dir / "report" / "index.html").read_text()
    for what in ("<h2>Stability</h2>", "stability.png", "sft[0] vs sft[2] (headline, sufficiency)",
                 "headline vs qa (sft[1], necessity)", "Spearman, coarse", "top-k overlap",
                 "Searched for the SFT model <b>sft[0]</b>", "tiny-llama:task", "sft[2]",
                 "Spearman, coarse: mean (min to max)"):
        assert what in text, what
    assert (multi.run_dir / "report" / "stability.png").stat().st_size > 5_000
    assert (multi.run_dir / "report" / "heatmap_sft1_necessity_qa.png").is_file()


def test_explore_shows_the_first_sft_models_map(multi):
    from weightgraft.explore.artifacts import LocalizeView

    view = LocalizeView(multi.run_dir).to_json()
    assert view["model"] == "sft[0]" and view["models"] == ["sft[0]", "sft[1]", "sft[2]"]
    cells = pd.read_parquet(multi.run_dir / "cells.parquet")
    first = cells[(cells["model"] == "sft[0]") & (cells["direction"] == "sufficiency") & (cells["template"] == "qa")]
    mean = first.groupby(["position_label", "slot"])["estimate"].mean()
    shown = next(m for m in view["maps"] if (m["direction"], m["template"]) == ("sufficiency", "qa"))
    assert len(shown["values"]["estimate"]) == len(mean)
    for label, slot, v in shown["values"]["estimate"]:
        assert v == pytest.approx(mean[(label, slot)], rel=1e-6, abs=1e-9)


# ------------------------------------------------------------------ extending a run, exact values

@pytest.mark.slow
def test_appending_sft_models_extends_a_run_and_other_changes_are_refused(tmp_path):
    extra = {"exact": "all", "graft_directions": ["sufficiency"], "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"enabled": False}, "report": False}
    first = localize(parse_localize_config(_raw(tmp_path, SFTS[0], **extra)), progress=False, load=loader)
    single = pd.read_csv(first.run_dir / "stability.csv")
    assert set(single["kind"]) == {"template"} and len(single) == 1  # one SFT model: the template pair only
    assert list(single["model_a"]) == ["sft"] and list(single["value"]) == ["exact"]
    _check_table(pd.read_parquet(first.run_dir / "cells.parquet"), single)
    stamps = {p: p.stat().st_mtime_ns for p in (first.run_dir / "parts").glob("*.parquet")}

    second = localize(parse_localize_config(_raw(tmp_path, SFTS[:2], **extra)), progress=False, load=loader)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # the first SFT model's parts reused
    cells = pd.read_parquet(second.run_dir / "cells.parquet")
    assert list(dict.fromkeys(cells["model"])) == ["sft[0]", "sft[1]"]
    old = first.cells.drop(columns="model").reset_index(drop=True)
    pd.testing.assert_frame_equal(cells[cells["model"] == "sft[0]"].drop(columns="model").reset_index(drop=True), old)
    table = pd.read_csv(second.run_dir / "stability.csv")
    assert _check_table(cells, table) == 2 + 2 and set(table["value"]) == {"exact"}

    for changed in ([SFTS[1], SFTS[0]], SFTS[0], [SFTS[0], SFTS[2]]):  # reordered, shortened, replaced
        with pytest.raises(ValueError, match="another config|append SFT models") as err:
            localize(parse_localize_config(_raw(tmp_path, changed, **extra)), progress=False, load=no_load)
        assert "\n" not in str(err.value)


def test_sft_models_trained_on_different_directions_are_refused(tmp_path):
    from weightgraft.training.outputs import MANIFEST_NAME

    folders = []
    for name, split in (("seed0", "a2b"), ("seed1", "a2b"), ("seed2", "b2a")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / MANIFEST_NAME).write_text(json.dumps({"data": {"split": split}}))
        folders.append(str(folder))
    same = parse_localize_config({**_raw(tmp_path, folders[:2]), "out": str(tmp_path / "a")})
    from weightgraft.localization.prompts import choose_directions

    assert choose_directions(same).directions == ["a2b"]
    mixed = parse_localize_config({**_raw(tmp_path, folders), "out": str(tmp_path / "b")})
    with pytest.raises(ValueError, match=r"different directions \(sft\[0\]: \['a2b'\], sft\[2\]: \['b2a'\]\)") as err:
        localize(mixed, progress=False, load=no_load)
    assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_cli_prints_the_stability_summary(tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    import weightgraft.api.pipelines as loc
    from weightgraft.cli import app

    real = loc.run_localize  # the CLI's call, with tiny models; the page is still drawn by the front door
    monkeypatch.setattr(loc, "run_localize",
                        lambda cfg, progress=True, load=None: real(cfg, progress=False, load=copy_loader))
    cfg = tmp_path / "loc.yaml"
    cfg.write_text(yaml.safe_dump({**_raw(tmp_path, SFTS[:2]), "exact": "none", "report": False,
                                   "graft_directions": ["sufficiency"], "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"enabled": False}}))
    out = CliRunner().invoke(app, ["localize", str(cfg)], catch_exceptions=False).output.replace("\n", "")
    table = pd.read_csv(tmp_path / "run" / "stability.csv")
    assert "stability over SFT models: 2 pair(s)" in out and "stability over templates: 2 pair(s)" in out
    assert f"stability: {tmp_path / 'run' / 'stability.csv'}" in out and len(table) == 4


def test_rows_finer_than_a_cell_are_refused_not_summed(multi):
    from weightgraft.localization.stability import stability_table

    cells = pd.read_parquet(multi.run_dir / "cells.parquet")
    split = pd.concat([cells.assign(estimate=cells["estimate"] / 2)] * 2)  # two rows per cell, as units would be
    with pytest.raises(ValueError, match="several rows per cell"):
        stability_table(split)
    pd.testing.assert_frame_equal(stability_table(cells), pd.read_csv(multi.run_dir / "stability.csv"), check_dtype=False)
