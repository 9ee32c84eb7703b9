"""The planner on hybrids and on gpt-oss's sinks, from the config alone: a hybrid's cache is its
attention layers' keys and values and, per row, each mixer layer's conv and recurrent states (equal
to the bytes transformers' ``DynamicCache`` holds after a pass, on tiny LFM2, Qwen3.5 and Nemotron-H);
a dense model's is every layer's keys and values as before; multi-head latent attention's is its
decompressed keys and values per query head, as a grafted pass caches them; a part naming some tensors of its
module (``sinks``) prices those in the graft deltas, not the module."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from tiny_models import HYBRID_CONFIGS, MOE_CONFIGS, TINY_CONFIGS, make_tiny

from weightgraft.engine import projections
from weightgraft.engine.architectures import model_slots
from weightgraft.models.spec import parse_spec
from weightgraft.planning.costs import cache_bytes, delta_bytes, inference_bytes


def _footprint(tmp_path: Path, arch: str):
    config = copy.deepcopy({**TINY_CONFIGS, **MOE_CONFIGS}[arch])
    config.save_pretrained(tmp_path / arch)  # Nemotron-H's time_step_limit holds an infinity: read back as one
    return parse_spec(f"random:{tmp_path / arch / 'config.json'}").footprint()


def _held(cache) -> int:
    """The bytes of every tensor a ``DynamicCache`` holds: keys, values, conv and recurrent states."""
    total = 0
    for layer in cache.layers:
        tensors = [getattr(layer, k, None) for k in ("keys", "values")]
        tensors += [t for k in ("conv_states", "recurrent_states") for t in (getattr(layer, k, None) or {}).values()]
        total += sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))
    return total


@pytest.mark.parametrize("arch", sorted(HYBRID_CONFIGS))
@torch.no_grad()
def test_a_hybrids_cache_line_counts_its_mixer_states(tmp_path, arch):
    footprint = _footprint(tmp_path, arch)
    model = make_tiny(arch)
    for rows, seq in ((3, 11), (1, 4)):
        ids = torch.randint(3, 60, (rows, seq), generator=torch.Generator().manual_seed(rows))
        held = _held(model(input_ids=ids, use_cache=True).past_key_values)
        assert cache_bytes(footprint, rows, seq, "float32") == held
        assert inference_bytes(footprint, rows, seq, 1, "float32")["kv_cache"] == held
    per_token = 2 * footprint.kv_heads * footprint.head_dim * 4
    # a mixer layer's states do not grow with the prompt: only the attention layers' keys and values do
    grown = cache_bytes(footprint, 1, 101, "float32") - cache_bytes(footprint, 1, 1, "float32")
    # Falcon-H1's "hybrid" layers hold attention beside the mixer
    assert grown == 100 * per_token * sum(k in ("full_attention", "hybrid") for k in _kinds(footprint.config))
    assert inference_bytes(footprint, 3, 11, 1, "float32", kv=False)["kv_cache"] == 0


def _kinds(config) -> list[str]:
    return list(getattr(config, "layer_types", None) or config.layers_block_type)


def test_a_dense_models_cache_line_is_every_layers_keys_and_values(tmp_path):
    footprint = _footprint(tmp_path, "llama")
    want = 2 * footprint.layers * 3 * 11 * footprint.kv_heads * footprint.head_dim * 2
    assert cache_bytes(footprint, 3, 11, "bfloat16") == want


def test_graft_deltas_price_the_sinks_not_the_attention_module(tmp_path):
    footprint = _footprint(tmp_path, "gpt_oss")
    meta = footprint.meta
    paths = {p.path for s in model_slots(meta) for p in s.parts if p.tensors is None}
    modules = [meta.get_submodule(p) for p in paths]
    proj = sum(p.numel() for m in modules if projections.is_projection(m) for p in m.parameters())
    other = sum(p.numel() for m in modules if not projections.is_projection(m) for p in m.parameters())
    sinks = sum(meta.get_submodule(p.path).sinks.numel() for s in model_slots(meta) for p in s.parts if p.tensors)
    assert sinks == footprint.heads * footprint.layers
    assert delta_bytes(footprint, "float32") == 4 * (proj + 2 * other + 2 * sinks)


@torch.no_grad()
def test_an_mla_cache_line_counts_the_decompressed_keys_and_values_a_grafted_pass_holds(tmp_path):
    """DeepSeek-V3: a grafted pass caches each position's keys and values as its kv_b made them, per
    query head (qk_nope + qk_rope and v_head_dim wide), not 2 x kv_heads x head_dim: the plan counts that."""
    from transformers import DynamicCache

    from weightgraft.engine.forward import graft_call
    from weightgraft.engine.source_map import SourceMap
    from weightgraft.planning.depth_states import depth_state_bytes

    footprint = _footprint(tmp_path, "deepseek_v3")
    base = make_tiny("deepseek_v3")
    config = footprint.config
    assert 2 * footprint.kv_heads * footprint.head_dim != config.num_attention_heads * (
        config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim)  # the old count was another number
    n = len(model_slots(base))
    for rows, seq in ((3, 11), (1, 4)):
        ids = torch.randint(3, 60, (rows, seq), generator=torch.Generator().manual_seed(rows))
        cache = DynamicCache(config=base.config)
        source = SourceMap(torch.zeros(rows, seq, n, dtype=torch.long))
        graft_call([base], ids, source, past_key_values=cache, use_cache=True)
        held = _held(cache)
        assert cache_bytes(footprint, rows, seq, "float32") == held
        assert inference_bytes(footprint, rows, seq, 1, "float32")["kv_cache"] == held
        residuals = 4 * rows * config.num_hidden_layers * seq * config.hidden_size  # depth sharing's references
        assert depth_state_bytes(config, rows, seq, 0) == held + residuals
