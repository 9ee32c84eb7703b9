"""Every input error raised through ``wg.*``, a config or a CLI option is a
``wg.WeightgraftError`` in one line, with pydantic's field errors translated (no web link);
and small names mean one thing (``prompt`` is a prompt's text in every frame)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli import app
from weightgraft.experiments.config import load_config, parse_config
from weightgraft.localization.config import parse_localize_config
from weightgraft.training.lora import LoraSettings
from weightgraft.training.presets import get_preset

PROMPT = "Keanu Reeves starred in a movie with"
CONFIG = {"data": "data", "models": {"pre": "a", "sft": "b"}, "schemes": [{"preset": "position"}]}
LOCALIZE = {"data": "data", "models": {"pre": "a", "sft": "b"}}


def _api(name: str) -> Callable[[Any, Any, Any], Any]:
    """One bad call through a ``wg.*`` function, a Rule or a Scheme."""
    calls: dict[str, Callable[[Any, Any, Any], Any]] = {
        "Rule: misspelt component": lambda m, tok, tmp: wg.Rule(model="sft", components="fnn"),
        "Rule: unknown field": lambda m, tok, tmp: wg.Rule(model="sft", colour="red"),
        "Rule: wrong type": lambda m, tok, tmp: wg.Rule(model=3, layer_dropout=2),
        "Scheme: nested rule": lambda m, tok, tmp: wg.Scheme(name="x", rules=[{"model": "sft", "layers": "29..0"}]),
        "graft: unmarked span": lambda m, tok, tmp: wg.graft(m, tok, PROMPT, wg.Rule(model="sft", positions="actor")),
        "graft: label the prompt lacks": lambda m, tok, tmp: wg.graft(
            m, tok, PROMPT, wg.Rule(model="sft", positions="first_entity_last-40"), spans={"actor": "Keanu Reeves"}),
        "graft: unknown role": lambda m, tok, tmp: wg.graft(m, tok, PROMPT, wg.Rule(model="task")),
        "compare: answers": lambda m, tok, tmp: wg.compare(m, tok, [PROMPT, PROMPT], ["Tom"], wg.presets.position()),
        "generate: unmarked span": lambda m, tok, tmp: wg.generate(m, tok, PROMPT, wg.Rule(model="sft", positions="actor")),
        "tokens: span not in prompt": lambda m, tok, tmp: wg.tokens(tok, PROMPT, spans={"actor": "Meryl Streep"}),
        "explain: layer past the depth": lambda m, tok, tmp: wg.explain(wg.Rule(model="sft", layers="40"), m["pre"]),
        "presets: unknown": lambda m, tok, tmp: wg.presets.preset("nope"),
        "localize: unknown key": lambda m, tok, tmp: wg.localize({**LOCALIZE, "colour": 1, "exact": 0}),
        "localize: missing file": lambda m, tok, tmp: wg.localize(tmp / "none.yaml"),
    }
    return calls[name]


def _config(name: str) -> Callable[[Any], Any]:
    """One bad config (experiment, localize, training preset, LoRA settings)."""
    def yaml_file(tmp):
        path = tmp / "exp.yaml"
        path.write_text("data: data\nmodels: {pre: a, sft: b}\nschemes:\n  - name: x\n"
                        "    rules: [{model: sft, components: o+fnn, positionz: last}]\n")
        return load_config(path)

    calls: dict[str, Callable[[Any], Any]] = {
        "experiment: types and keys": lambda tmp: parse_config({**CONFIG, "batch_size": "many", "colour": 1}),
        "experiment: nested rule (YAML)": yaml_file,
        "experiment: missing file": lambda tmp: load_config(tmp / "none.yaml"),
        "localize: types and keys": lambda tmp: parse_localize_config({**LOCALIZE, "exact": 0, "search": {"x": 1}}),
        "training preset": lambda tmp: get_preset("cpu-quick", learning_rate="fast", epochs=-1),
        "LoRA settings": lambda tmp: LoraSettings(rank=0, dropout=2.0),
    }
    return calls[name]


def _one_line(err: BaseException) -> None:
    text = str(err)
    assert isinstance(err, wg.WeightgraftError), type(err)
    assert text and "\n" not in text, text
    assert "pydantic.dev" not in text and "errors.pydantic" not in text, text


API = ["Rule: misspelt component", "Rule: unknown field", "Rule: wrong type", "Scheme: nested rule",
       "graft: unmarked span", "graft: label the prompt lacks", "graft: unknown role", "compare: answers",
       "generate: unmarked span", "tokens: span not in prompt", "explain: layer past the depth",
       "presets: unknown", "localize: unknown key", "localize: missing file"]


@pytest.mark.parametrize("name", API)
def test_api_input_errors_are_one_weightgraft_line(name, tiny_pair, tiny_tok, tmp_path):
    pre, sft = tiny_pair("llama")
    with pytest.raises(Exception) as err:
        _api(name)({"pre": pre, "sft": sft}, tiny_tok, tmp_path)
    _one_line(err.value)


@pytest.mark.parametrize("name", ["experiment: types and keys", "experiment: nested rule (YAML)",
                                  "experiment: missing file", "localize: types and keys", "training preset",
                                  "LoRA settings"])
def test_config_input_errors_are_one_weightgraft_line(name, tmp_path):
    with pytest.raises(Exception) as err:
        _config(name)(tmp_path)
    _one_line(err.value)
    if name != "experiment: missing file":  # every bad field is named, not the first alone
        assert str(err.value).count(":") >= 3


def test_a_config_names_every_bad_field_with_its_path(tmp_path):
    with pytest.raises(wg.WeightgraftError) as err:
        _config("experiment: nested rule (YAML)")(tmp_path)
    assert "at schemes.0.rules.0.components: unknown component 'fnn'" in str(err.value)
    assert "at schemes.0.rules.0.positionz: Extra inputs are not permitted" in str(err.value)


@pytest.mark.parametrize("args, said", [
    (["generate", PROMPT, "-m", "pre=a", "-m", "sft=b", "-r", "model=sft,components=fnn"], "unknown component 'fnn'"),
    (["generate", PROMPT, "-m", "pre=a", "-m", "sft=b", "-r", "model=sft,colour=red"], "colour: Extra inputs"),
])
def test_cli_options_say_the_rule_error_in_one_line(args, said, monkeypatch):
    def never(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("weightgraft.models.loading.read_location", never)
    monkeypatch.setattr("weightgraft.models.loading.read_embedded", never)
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    flat = " ".join(line.strip(" │╭╮╰╯─") for line in out.output.splitlines())
    assert said in flat and "pydantic.dev" not in out.output and "Traceback" not in out.output


def test_cli_config_error_is_one_weightgraft_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data: data\nmodels: {pre: a}\nschemes: [{preset: position}]\nbatch_size: many\ncolour: 1\n")
    out = CliRunner().invoke(app, ["run", str(path)])
    assert out.exception is not None
    _one_line(out.exception)


def test_prompt_is_the_text_in_top_frame_as_in_compare(tiny_pair, tiny_tok):
    """``prompt`` is a prompt's text in every frame; ``top_frame`` gives its index its own column
    (it was ``prompt`` there, the text ``text``)."""
    pre, sft = tiny_pair("llama")
    models, prompts = {"pre": pre, "sft": sft}, [PROMPT, "Paris is in"]
    frame = wg.graft(models, tiny_tok, prompts, wg.Rule(model="sft", positions="last")).top_frame(2)
    rows = wg.compare(models, tiny_tok, prompts, ["Tom", "France"], [s for s in wg.presets.position() if s.name == "LT"])
    assert frame["prompt"].unique().tolist() == rows["prompt"].tolist() == prompts
    assert frame["prompt_index"].tolist() == [0, 0, 1, 1] and "text" not in frame


def test_one_prompt_is_a_string_with_one_mapping_of_spans(tiny_pair, tiny_tok):
    """graft, compare, generate and tokens take one prompt as a string and its spans as a dict."""
    pre, sft = tiny_pair("llama")
    models, spans = {"pre": pre, "sft": sft}, {"actor": "Keanu Reeves"}
    rule = wg.Rule(model="sft", positions="first_entity", components="attn")
    one = wg.graft(models, tiny_tok, PROMPT, rule, spans=spans)
    many = wg.graft(models, tiny_tok, [PROMPT], rule, spans=[spans])
    assert one.logits.equal(many.logits) and "1 prompt," in repr(one)
    assert wg.compare(models, tiny_tok, PROMPT, "Tom", rule, spans=spans)["prompt"].tolist() == [PROMPT]
    assert isinstance(wg.generate(models, tiny_tok, PROMPT, rule, max_new_tokens=2, spans=spans), str)
    assert len(wg.tokens(tiny_tok, PROMPT, spans=spans)) == len(tiny_tok(PROMPT)["input_ids"])
