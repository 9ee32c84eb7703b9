"""The shipped experiment configs (the paper's sweeps) validate and compile on a model."""

from __future__ import annotations

from pathlib import Path

import pytest

import weightgraft as wg
from weightgraft.graft.architectures import model_slots
from weightgraft.experiments.config import load_config
from weightgraft.experiments.schemes import compile_scheme
import copy

import transformers as T

from tiny_models import TINY_CONFIGS

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert len(CONFIGS) >= 6


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
    (roles,) = config.sets().values()
    index = {r: i for i, r in enumerate(roles)}
    for scheme in schemes:
        compile_scheme(scheme, names, index, slot_heads)
