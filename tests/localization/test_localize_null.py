"""Null models in localize (finetunes without the prompts' facts): config forms and one-line
refusals, null maps beside the SFT maps in cells.parquet and stability.csv, and the verdict of
``stability_null.csv``, which must hold on planted structure and fail where the null shares it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from tiny_world import loader, write_world

from weightgraft.api.localize import localize
from weightgraft.experiments.config import ConfigError
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.stability import null_summary, stability_table

SFTS = ["tiny-llama:sft", "tiny-llama:sft-copy"]  # the second: the first's weights again


def copy_loader(spec: str, config=None):
    return loader("tiny-llama:sft" if spec == "tiny-llama:sft-copy" else spec, config)


def no_load(*_):
    raise AssertionError("a model was loaded")


def _raw(tmp_path, sft, null=None, **extra):
    models = {"pre": "tiny-llama:pre", "sft": sft, **({"nulls": null} if null is not None else {})}
    return {"name": "nulls", "data": str(write_world(tmp_path / "data", n=4)), "out": str(tmp_path / "run"),
            "models": models, "batch_size": 3, "exact_chunk": 64, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, **extra}


# ------------------------------------------------------------------ config

def test_null_forms_labels_and_identity(tmp_path):
    cfg = parse_localize_config(_raw(tmp_path, SFTS, ["tiny-llama:task", "tiny-llama:relation"]))
    assert cfg.null_models() == [("null[0]", "tiny-llama:task"), ("null[1]", "tiny-llama:relation")]
    assert [label for label, _ in cfg.mapped_models()] == ["sft[0]", "sft[1]", "null[0]", "null[1]"]
    assert cfg.roles()["null[1]"] == "tiny-llama:relation" and "nulls" not in cfg.roles()
    # null models are not part of the identity: appending them extends a run
    assert cfg.identity() == parse_localize_config(_raw(tmp_path, SFTS)).identity()
    assert parse_localize_config(_raw(tmp_path, SFTS)).null_models() == []


@pytest.mark.parametrize("null, message", [
    ("tiny-llama:task", "models.nulls: a non-empty list of model specs"),
    ([], "models.nulls: a non-empty list of model specs"),
    (["tiny-llama:task", 3], "models.nulls: a non-empty list of model specs"),
    (["tiny-llama:task", "tiny-llama:task"], "models.nulls lists 'tiny-llama:task' more than once"),
    (["tiny-llama:sft"], "models.nulls lists 'tiny-llama:sft', which models.sft lists too"),
])
def test_bad_null_lists_are_one_line_errors(tmp_path, null, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_localize_config(_raw(tmp_path, SFTS, null))
    assert len(str(err.value).splitlines()) == 1  # the file and the problem, in one line


def test_unknown_null_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="nulls"):
        parse_localize_config({**_raw(tmp_path, SFTS), "nulls": ["tiny-llama:task"]})  # not under models


def test_a_bare_yaml_null_key_is_a_one_line_error(tmp_path):
    import yaml

    from weightgraft.localization.config import load_localize_config

    path = tmp_path / "loc.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path, SFTS)).replace("models:\n", "models:\n  null: [tiny-llama:task]\n"))
    with pytest.raises(ConfigError, match="a role name must be a string, got None .null models go under 'nulls'.") as err:
        load_localize_config(path)
    assert len(str(err.value).splitlines()) == 1


# ------------------------------------------------------------------ a run with a null model

SLOW_FIXTURES = ("run",)  # its tests are `slow` (tests/conftest.py): localize with null models


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("null_run")
    raw = _raw(tmp, SFTS, ["tiny-llama:task"], exact=1, graft_directions=["sufficiency"],
               search={"enabled": False}, claims={"enabled": False}, report=False)
    return localize(parse_localize_config(raw), progress=False, load=copy_loader), tmp


def test_null_maps_sit_beside_the_sft_maps(run):
    result, _ = run
    cells = pd.read_parquet(result.run_dir / "cells.parquet")
    assert list(dict.fromkeys(cells["model"])) == ["sft[0]", "sft[1]", "null[0]"]
    sizes = cells.groupby("model").size()
    assert sizes.nunique() == 1  # the same prompts and cells for every mapped model
    exact = cells.groupby("model")["exact"].apply(lambda s: int(s.notna().sum()))
    assert exact.nunique() == 1 and exact.iloc[0] > 0  # exact where configured, for the null too
    keys = ["template", "direction", "example_id", "position", "slot"]
    null = cells[cells["model"] == "null[0]"].sort_values(keys)["estimate"].to_numpy()
    sft = cells[cells["model"] == "sft[0]"].sort_values(keys)["estimate"].to_numpy()
    assert not np.allclose(null, sft)  # another donor, another map
    assert (result.run_dir / "parts" / "null0" / "estimates_sufficiency.parquet").is_file()
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert manifest["null_models"] == ["null[0]"] and manifest["sft_models"] == ["sft[0]", "sft[1]"]
    assert manifest["models"]["null[0]"]["spec"] == "tiny-llama:task"


def test_stability_rows_name_their_kind(run):
    result, _ = run
    table = pd.read_csv(result.run_dir / "stability.csv")
    models = table[table["kind"] != "template"]
    got = set(zip(models["kind"], models["model_a"], models["model_b"], models["template_a"]))
    want = {(k, a, b, t) for t in ("headline", "qa") for k, a, b in
            (("sft", "sft[0]", "sft[1]"), ("sft_vs_null", "sft[0]", "null[0]"), ("sft_vs_null", "sft[1]", "null[0]"))}
    assert got == want and len(models) == len(want)
    assert set(table[table["kind"] == "template"]["model_a"]) == {"sft[0]", "sft[1]", "null[0]"}
    same = table[table["kind"] == "sft"]
    np.testing.assert_allclose(same["spearman_coarse"], 1.0, rtol=0, atol=1e-12)  # one model's weights twice
    assert (table[table["kind"] == "sft_vs_null"]["spearman_coarse"] < 1.0).all()
    summary = pd.read_csv(result.run_dir / "stability_null.csv")
    assert list(summary["template"]) == ["headline", "qa"]
    assert (summary["n_sft_pairs"] == 1).all() and (summary["n_null_pairs"] == 2).all()
    # separated (identical seeds), but 2 seeds beside 1 null: 3 labelings, least p 1/3: undecided, and says why
    assert summary["verdict"].str.startswith("undecided: 2 seeds beside 1 null(s) cannot reach").all()
    assert summary["separation_p"].to_numpy() == pytest.approx([1 / 3, 1 / 3])


def test_report_shows_the_null_comparison(run, tmp_path):
    from weightgraft.report.localize import _header, _stability_section  # the page's parts, without heatmaps

    result, _ = run
    cells = pd.read_parquet(result.run_dir / "cells.parquet")
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    text = _header(result.run_dir, manifest, cells) + _stability_section(result.run_dir, cells, tmp_path)
    for what in ("sft_vs_null", "Seeds against a null", "sft[0] vs null[0] (headline, sufficiency)", "null[0]",
                 "tiny-llama:task", "undecided"):
        assert what in text, what


def test_appending_a_null_extends_the_run_and_changing_one_is_refused(run, tmp_path):
    import shutil

    tmp = run[1]  # the fixture's data; its run copied, so that the other tests see it as it was
    shutil.copytree(run[0].run_dir, tmp_path / "run")
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "run" / "parts").rglob("*.parquet")}
    base = dict(exact=1, graft_directions=["sufficiency"], search={"enabled": False}, claims={"enabled": False},
                report=False)
    base["out"] = str(tmp_path / "run")
    more = localize(parse_localize_config(_raw(tmp, SFTS, ["tiny-llama:task", "tiny-llama:relation"], **base)),
                    progress=False, load=copy_loader)
    assert more.run_dir == tmp_path / "run"
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # earlier maps reused
    assert list(dict.fromkeys(more.cells["model"])) == ["sft[0]", "sft[1]", "null[0]", "null[1]"]
    table = pd.read_csv(more.run_dir / "stability.csv")
    pairs = table[(table["model_b"] == "null[1]") & (table["kind"] != "template")]
    assert set(pairs["kind"]) == {"sft_vs_null", "null_vs_null"} and len(pairs) == 2 * 3
    for changed in (["tiny-llama:relation"], ["tiny-llama:relation", "tiny-llama:task"]):
        with pytest.raises(ValueError, match="append null models") as err:
            localize(parse_localize_config(_raw(tmp, SFTS, changed, **base)), progress=False, load=no_load)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------ the verdict on planted maps

SPANS = ["tok0", "first_entity_last", "relation_last", "last"]
COMPONENTS = ["attn", "mlp", "o"]
N_LAYERS, N_PROMPTS = 8, 3


def _cells(values: dict[str, np.ndarray]) -> pd.DataFrame:
    """Cells of one template and direction: per model, one value per (span, layer, component)
    cell, the same on every prompt."""
    rows = []
    for model, v in values.items():
        for p in range(N_PROMPTS):
            i = 0
            for pos, label in enumerate(SPANS):
                for layer in range(N_LAYERS):
                    for comp in COMPONENTS:
                        rows.append({"model": model, "template": "headline", "direction": "sufficiency",
                                     "example_id": f"r{p}", "position": pos, "position_label": label,
                                     "slot": f"L{layer}.{comp}", "layer": layer, "component": comp,
                                     "estimate": v[i], "exact": np.nan})
                        i += 1
    return pd.DataFrame(rows)


def _planted(null_shares_structure: bool, seed: int = 0, n_seeds: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = len(SPANS) * N_LAYERS * len(COMPONENTS)
    structure = rng.lognormal(0.0, 1.5, n)
    other = rng.lognormal(0.0, 1.5, n)
    noisy = lambda base: base * np.exp(rng.normal(0.0, 0.3, n))  # noqa: E731
    values = {f"sft[{i}]": noisy(structure) for i in range(n_seeds)}
    values |= {f"null[{j}]": noisy(structure if null_shares_structure else other) for j in range(2)}
    return _cells(values)


def test_three_seeds_beside_two_nulls_cannot_exceed_and_say_how_many_seeds_could():
    """5 models: 10 labelings, least p 0.1, whatever the maps: the verdict says so."""
    row = null_summary(stability_table(_planted(False), nulls=["null[0]", "null[1]"])).iloc[0]
    assert row["separation_p"] == pytest.approx(1 / 10)
    assert row["verdict"] == "undecided: 3 seeds beside 2 null(s) cannot reach p <= 0.05 (least p 0.1; 5 seeds could)"


def test_verdict_exceeds_on_planted_structure():
    table = stability_table(_planted(False, n_seeds=5), nulls=["null[0]", "null[1]"])
    assert list(table["kind"].value_counts().sort_index().items()) == [("null_vs_null", 1), ("sft", 10), ("sft_vs_null", 10)]
    summary = null_summary(table)
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["verdict"] == "exceeds" and row["separation_p"] == pytest.approx(1 / 21)
    sft, null = table[table["kind"] == "sft"], table[table["kind"] == "sft_vs_null"]
    assert row["sft_spearman_mean"] == pytest.approx(sft["spearman_coarse"].mean())
    assert row["null_overlap_mean"] == pytest.approx(null["top_overlap"].mean())
    assert row["sft_spearman_min"] > row["null_spearman_max"] and row["sft_overlap_min"] > row["null_overlap_max"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verdict_does_not_exceed_when_the_null_shares_the_structure(seed):
    summary = null_summary(stability_table(_planted(True, seed), nulls=["null[0]", "null[1]"]))
    assert list(summary["verdict"]) == ["does not exceed"]


def test_verdict_is_undecided_without_seeds_pairs_or_nulls():
    cells = _planted(False)
    no_null = null_summary(stability_table(cells[~cells["model"].str.startswith("null")]))
    assert list(no_null["verdict"]) == ["undecided"] and list(no_null["n_null_pairs"]) == [0]
    one_seed = cells[cells["model"].isin(["sft[0]", "null[0]", "null[1]"])]
    summary = null_summary(stability_table(one_seed, nulls=["null[0]", "null[1]"]))
    assert list(summary["verdict"]) == ["undecided"] and list(summary["n_sft_pairs"]) == [0]


def test_cli_prints_seeds_against_the_null(run, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    import weightgraft.api.localize as loc
    from weightgraft.cli import app

    result, tmp = run
    monkeypatch.setattr(loc, "localize", lambda cfg, progress=True: result)  # the fixture's run, printed
    cfg = tmp / "nulls.yaml"
    cfg.write_text(yaml.safe_dump(_raw(tmp, SFTS, ["tiny-llama:task"])))
    out = CliRunner().invoke(app, ["localize", str(cfg)], catch_exceptions=False).output.replace("\n", "")
    summary = pd.read_csv(result.run_dir / "stability_null.csv").iloc[0]
    assert "stability over SFT vs null models: 4 pair(s)" in out and "stability over SFT models: 2 pair(s)" in out
    assert (f"seeds vs null, headline / sufficiency: Spearman {summary['sft_spearman_mean']:.2f} vs "
            f"{summary['null_spearman_mean']:.2f}") in out
    assert "(means of 1 and 2 pairs): undecided" in out


def test_the_report_says_why_one_seed_against_a_null_is_undecided():
    from weightgraft.report.localize import _null_table

    cells = _planted(False)
    one_seed = cells[cells["model"].isin(["sft[0]", "null[0]", "null[1]"])]
    text = _null_table(null_summary(stability_table(one_seed, nulls=["null[0]", "null[1]"])))
    assert "no pair of SFT models (one training seed)" in text and "nan" not in text
    assert "permutation test over the models' labels" in text
