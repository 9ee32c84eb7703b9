"""Gemma 4's layer against the per-token definition, where the matrix of test_engine.py cannot
see it: a learned scale of each block's output (``layer_scalar``, a buffer the matrix's random
models leave at one) that differs between the models, per-layer inputs (PLE) grafted at one
position, keys and values that later layers reuse (KV sharing), and what is refused from the config."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from tiny_models import TINY_CONFIGS, make_donor, make_tiny, padded_ids

import weightgraft as wg
from weightgraft.engine.architectures import UnsupportedArchitectureError, adapter_for, model_slots
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward


@torch.no_grad()
def _models() -> list[torch.nn.Module]:
    base = make_tiny("gemma4_text", seed=0).double()
    models = [base, make_donor(base, 1), make_donor(base, 2)]
    for m, model in enumerate(models):  # each model its own scale per block, as a checkpoint's
        for i, layer in enumerate(model.model.layers):
            layer.layer_scalar.fill_(0.5 + 0.25 * m + 0.1 * i)
    return models


def _one(models, ids: torch.Tensor, name: str, position: int, model: int = 1) -> torch.Tensor:
    names = wg.slots(models[0])
    source = torch.zeros(*ids.shape, len(names), dtype=torch.long)
    source[:, position, names.index(name)] = model
    return source


@torch.no_grad()
def test_random_maps_with_differing_block_scales_equal_the_definition():
    models = _models()
    n = len(wg.slots(models[0]))
    with float64_exact(models):
        for side in ("left", "right"):
            ids, mask = padded_ids(side=side)
            source = torch.randint(0, 3, (*ids.shape, n), generator=torch.Generator().manual_seed(4))
            fast = wg.graft_forward(models, ids, source, attention_mask=mask)
            ref = per_token_forward(models, ids, source, attention_mask=mask)
            real = mask.bool()
            assert (fast[real] - ref[real]).abs().max().item() <= 1e-10
            assert (ref[real] - models[0](input_ids=ids, attention_mask=mask).logits[real]).abs().max().item() > 1e-1
        for m, model in enumerate(models):  # a uniform map is each model, bit for bit
            uniform = wg.graft_forward(models, ids, torch.full((*ids.shape, n), m))
            assert torch.equal(uniform, model(input_ids=ids).logits)


@torch.no_grad()
def test_one_block_scale_ple_part_or_stored_key_at_one_position():
    """The scale, each per-layer-input part and the keys of a layer whose keys a later layer reuses,
    grafted alone at position 3: equal to the definition, the logits move there or after, never before."""
    models = _models()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    stores = [i for i, mode in enumerate(models[0].config.kv_sharing_modes) if mode == "store"]
    names = ["layers.0.layer_scalar", "layers.1.ple_gate", "layers.2.ple_proj", "layers.3.ple_norm",
             f"layers.{stores[0]}.k"]
    with float64_exact(models):
        plain = models[0](input_ids=ids).logits
        for name in names:
            source = _one(models, ids, name, position=3)
            fast = wg.graft_forward(models, ids, source)
            assert (fast - per_token_forward(models, ids, source)).abs().max().item() <= 1e-10, name
            assert (fast[:, :3] - plain[:, :3]).abs().max().item() <= 1e-10, name
            assert (fast[:, 3:] - plain[:, 3:]).abs().max().item() > 1e-3, name


def test_slots_follow_the_kv_sharing_modes():
    base = make_tiny("gemma4_text")
    modes = base.config.kv_sharing_modes
    assert "reuse" in modes and "store" in modes
    for i, mode in enumerate(modes):
        names = {s.name.split(".", 2)[2] for s in model_slots(base) if s.name.startswith(f"layers.{i}.")}
        assert {"q", "q_norm", "o", "ple_gate", "ple_proj", "ple_norm", "layer_scalar"} <= names
        assert ("k" in names) == (mode != "reuse")  # a reusing layer has no keys of its own
        k_eq_v = base.config.layer_types[i] == "full_attention"  # its values are its keys: no v
        assert ("v" in names) == (mode != "reuse" and not k_eq_v)
    embed = next(s for s in model_slots(base) if s.name == "embed")
    assert len(embed.parts) == 4  # the token embedding and the per-layer inputs' three parts


def test_refused_from_the_config_and_admitted_without_per_layer_inputs():
    config = TINY_CONFIGS["gemma4_text"]
    for change, why in ((dict(enable_moe_block=True), "enable_moe_block"),
                        (dict(use_bidirectional_attention="all"), "use_bidirectional_attention")):
        with pytest.raises(UnsupportedArchitectureError, match=why):
            adapter_for(T.Gemma4TextConfig(**{**config.to_dict(), **change}))
    plain = T.Gemma4TextConfig(**{**config.to_dict(), "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0})
    model = T.Gemma4ForCausalLM(plain)
    names = wg.slots(model)
    assert not any(n.endswith(("ple_gate", "ple_proj", "ple_norm")) for n in names)
    assert len(next(s for s in model_slots(model) if s.name == "embed").parts) == 1
