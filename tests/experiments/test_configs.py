"""The shipped experiment configs (the paper's sweeps) validate and compile on a model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import transformers as T
from tiny_models import TINY_CONFIGS

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.experiments.config import load_config
from weightgraft.schemes.scheme import compile_scheme

CONFIGS = sorted((Path(__file__).parent.parent.parent / "configs").rglob("*.yaml"))
PAPER = [p for p in CONFIGS if p.parent.name == "paper"]


def test_there_are_configs():
    assert len(CONFIGS) >= 6
    assert {p.stem for p in PAPER} >= {"position", "position_spans", "component", "component_reversal",
                                       "hybrid", "lm_head", "layer_dropout"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_config_validates_and_compiles(path, model_type):
    config = load_config(path)
    schemes = config.resolved_schemes()
    deep = copy.deepcopy(TINY_CONFIGS[model_type])
    deep.num_hidden_layers = 8  # quarters and eighths need a few layers
    deep.hidden_size, deep.num_attention_heads = 36, 9  # SmolLM2's 9 heads (configs/heads.yaml)
    if model_type == "llama":
        deep.num_key_value_heads, deep.head_dim = 3, 4
    model = T.AutoModelForCausalLM.from_config(deep)
    names = wg.slots(model)
    slot_heads = {s.name: s.heads for s in model_slots(model) if s.heads}
    (roles,) = config.spec_sets().values()  # with the scaled roles scaled rules name
    index = {r: i for i, r in enumerate(roles)}
    for scheme in schemes:
        compile_scheme(scheme, names, index, slot_heads, protocol=config.protocol,
                       tied_embeddings=model.config.tie_word_embeddings)


@pytest.fixture(scope="module")
def paper_world(tmp_path_factory):
    from weightgraft.data import build_dataset

    out = tmp_path_factory.mktemp("paper_world")
    build_dataset("fake_movies_real_actors", n=6, seed=0, out=out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_configs_run_on_tiny_models(path, paper_world, tmp_path):
    """Every shipped paper config runs end to end (authors protocol, paper prompts) on tiny
    llama models of 8 layers, 2 examples per template."""
    import json
    from types import SimpleNamespace

    from tiny_models import _randomize, make_donor, tiny_word_tokenizer

    from weightgraft.experiments.runner import run_experiment

    lines = [json.loads(x) for x in (paper_world / "test_prompts.jsonl").read_text().splitlines()]
    tok = tiny_word_tokenizer([x["prompt"] for x in lines] + [x["answer"] for x in lines])
    deep = copy.deepcopy(TINY_CONFIGS["llama"])
    deep.num_hidden_layers, deep.vocab_size, deep.tie_word_embeddings = 8, len(tok), True
    base = T.AutoModelForCausalLM.from_config(deep)
    _randomize(base, torch.Generator().manual_seed(0))
    base.eval()
    seeds = {"pre": 0, "sft": 1, "task": 2, "relation": 3, "one": 4, "both": 5}
    made = {r: base if s == 0 else make_donor(base, s) for r, s in seeds.items()}

    def load(spec, config=None):
        return SimpleNamespace(model=made[spec], tokenizer=tok, source=spec, weights_sha256=spec)

    roles = list(load_config(path).sets()["default"])
    config = load_config(path, [f"data={paper_world}", f"out={tmp_path / 'run'}", "limit=2",
                                "report=false", f"models={json.dumps({r: r for r in roles})}"])
    result = run_experiment(config, load=load, progress=False)
    assert config.protocol == ("paper" if path.stem == "differences_paper" else "authors")
    assert set(result.results["template"]) == set(config.templates)
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["protocol"] == config.protocol
    names = {s.name for s in config.resolved_schemes()}
    ran = set(result.results["scheme"])
    skipped = {s["scheme"] for s in result.exclusions["skipped_schemes"]}
    assert ran | skipped == names and ran  # every scheme ran somewhere or was reported skipped


def test_relative_paths_in_a_yaml_are_taken_from_its_folder(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "exp").mkdir(parents=True)
    (project / "models" / "sft").mkdir(parents=True)
    yaml_path = project / "exp" / "sweep.yaml"
    yaml_path.write_text(
        "data: ../data/fmra\nout: ../runs\nmodels: {pre: smollm2-135m, sft: ../models/sft}\n"
        "schemes: [{preset: position}]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(yaml_path)
    assert Path(cfg.data).resolve() == (project / "data" / "fmra").resolve()
    assert Path(cfg.out).resolve() == (project / "runs").resolve()
    assert Path(cfg.models["sft"]).resolve() == (project / "models" / "sft").resolve()
    assert cfg.models["pre"] == "smollm2-135m"  # an embedded name stays a name
    # values given on the command line are taken as typed, from the working directory
    cfg = load_config(yaml_path, ["data=mine", "models.sft=other/sft"])
    assert str(cfg.data) == "mine" and cfg.models["sft"] == "other/sft"
