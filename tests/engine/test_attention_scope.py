"""A user's half-precision models run with eager attention during a graft only: every front
door leaves ``config._attn_implementation`` as the user set it, on success and on error."""

from __future__ import annotations

import copy

import pytest
import torch

import weightgraft as wg
from weightgraft.engine.precision import eager_attention

PROMPTS = ["Paris is in", "Rome, the capital of Italy, lies on the river"]
RULE = wg.Rule(model="sft", positions="last", components="o")


@pytest.fixture
def sdpa_pair(tiny_pair):
    """A bfloat16 pair set to SDPA by its user, with a spy on what each forward pass saw."""
    base, donor = tiny_pair("llama", torch.float32)
    pre, sft = (copy.deepcopy(m).to(torch.bfloat16) for m in (base, donor))
    seen: list[str] = []
    for m in (pre, sft):
        m.config._attn_implementation = "sdpa"
    pre.model.layers[0].self_attn.register_forward_pre_hook(lambda mod, args: seen.append(mod.config._attn_implementation))
    return {"pre": pre, "sft": sft}, seen


def _impls(models) -> set[str]:
    return {m.config._attn_implementation for m in models.values()} | {
        mod.config._attn_implementation for m in models.values() for mod in m.modules() if hasattr(mod, "config")}


@torch.no_grad()
def test_every_front_door_leaves_the_users_attention_alone(sdpa_pair, tiny_tok):
    from weightgraft.engine.check import check_engine
    from weightgraft.explore.requests import GraftRequest
    from weightgraft.explore.session import Explorer

    models, seen = sdpa_pair
    calls = {
        "graft": lambda: wg.graft(models, tiny_tok, PROMPTS, RULE),
        "compare": lambda: wg.compare(models, tiny_tok, PROMPTS, ["France", "Tiber"], RULE),
        "generate": lambda: wg.generate(models, tiny_tok, PROMPTS[0], RULE, max_new_tokens=2),
        "explore": lambda: Explorer(models, tiny_tok).graft(GraftRequest(prompt=PROMPTS[0])),
        "check": lambda: check_engine(list(models.values()), torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)),
    }
    for name, call in calls.items():
        seen.clear()
        call()
        assert seen and set(seen) == {"eager"}, name  # the pass ran eager ...
        assert _impls(models) == {"sdpa"}, name  # ... and the models are the user's again
    ids = tiny_tok([PROMPTS[0]], return_tensors="pt")["input_ids"]
    seen.clear()
    with wg.grafted(models, tiny_tok, RULE) as model:
        model(ids)
        assert _impls(models) == {"sdpa"}  # between passes, too
    assert set(seen) == {"eager"} and _impls(models) == {"sdpa"}


@torch.no_grad()
def test_an_error_inside_a_pass_restores_the_attention(sdpa_pair, tiny_tok):
    models, _ = sdpa_pair

    def boom(module, args):
        raise RuntimeError("boom inside the forward")

    handle = models["pre"].model.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom inside the forward"):
            wg.graft(models, tiny_tok, PROMPTS, RULE)
    finally:
        handle.remove()
    assert _impls(models) == {"sdpa"}


def test_float_models_are_left_alone_and_a_model_given_twice_is_restored(tiny_pair):
    pre, _ = tiny_pair("llama", torch.float32)
    half = copy.deepcopy(pre).to(torch.bfloat16)
    half.config._attn_implementation = "sdpa"
    before = pre.config._attn_implementation
    with eager_attention([pre, half, half]):
        assert pre.config._attn_implementation == before and half.config._attn_implementation == "eager"
    assert pre.config._attn_implementation == before and half.config._attn_implementation == "sdpa"
