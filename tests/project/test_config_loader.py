"""One config loader for every pipeline (``configfile.RunInputs.parse`` / ``.load``): a run config
and a localize config are refused in the same words, name the path of each bad key, and take
``data`` and ``out`` from the YAML's folder."""

from __future__ import annotations

import pytest

from weightgraft.configfile import ConfigError
from weightgraft.experiments.config import ExperimentConfig, load_config
from weightgraft.localization.config import LocalizeConfig, load_localize_config

RUN = {"data": "data", "models": {"pre": "random:smollm2-135m", "sft": "random:smollm2-135m@1"},
       "schemes": [{"name": "sft", "rules": [{"positions": "*", "model": "sft"}]}]}
LOCALIZE = {"data": "data", "models": {"pre": "random:smollm2-135m", "sft": "random:smollm2-135m@1"}}


@pytest.mark.parametrize(("kind", "what"), [(ExperimentConfig, "an experiment"), (LocalizeConfig, "a localize")])
def test_a_config_that_is_no_mapping_is_refused_in_one_line(kind, what):
    with pytest.raises(ConfigError, match=f"^x.yaml: {what} config must be a mapping, got list$"):
        kind.parse(["data"], "x.yaml")


@pytest.mark.parametrize(("kind", "raw", "what"), [(ExperimentConfig, RUN, "experiment"), (LocalizeConfig, LOCALIZE, "localize")])
def test_a_bad_key_is_named_by_its_path(kind, raw, what):
    with pytest.raises(ConfigError, match=f"invalid {what} config x.yaml: at limitt: Extra inputs") as info:
        kind.parse({**raw, "limitt": 3}, "x.yaml")
    assert "\n" not in str(info.value)


def test_a_scheme_entry_is_named_without_the_union_tag():
    bad = {**RUN, "schemes": [{"name": "s", "rules": [{"positions": "*", "model": "sft", "layerz": 1}]}]}
    with pytest.raises(ConfigError, match=r"at schemes\.0\.rules\.0\.layerz") as info:
        ExperimentConfig.parse(bad, "x.yaml")
    assert "schemes.0.scheme" not in str(info.value)


@pytest.mark.parametrize(("load", "text"), [
    (load_config, "data: d\nout: o\nmodels: {pre: random:smollm2-135m, sft: random:smollm2-135m@1}\n"
                  "schemes: [{name: sft, rules: [{positions: '*', model: sft}]}]\n"),
    (load_localize_config, "data: d\nout: o\nmodels: {pre: random:smollm2-135m, sft: random:smollm2-135m@1}\n"),
])
def test_data_and_out_are_taken_from_the_yaml_folder(tmp_path, monkeypatch, load, text):
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "c.yaml"
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    config = load(path, ["limit=2"])
    assert config.data == tmp_path / "configs" / "d" and config.out == tmp_path / "configs" / "o"
    assert config.limit == 2
