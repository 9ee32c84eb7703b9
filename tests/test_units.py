"""Heads and neurons as units: the engine's per-neuron grafts against the per-token definition
on every architecture, single units against hand-made hybrid donors, and partial grafts with
one share per (position, slot, unit)."""

from __future__ import annotations

import copy

import pytest
import torch

import weightgraft as wg
from weightgraft.engine import projections
from weightgraft.engine.architectures import model_slots
from weightgraft.engine import attribution
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.reference import per_token_forward
from tiny_models import TINY_CONFIGS, make_donor, make_tiny

ARCHS = sorted(TINY_CONFIGS)
TOL = 1e-4


def _models(model_type: str, n: int, dtype: torch.dtype = torch.float32) -> list[torch.nn.Module]:
    base = make_tiny(model_type, seed=0).to(dtype)
    return [base] + [make_donor(base, seed=i).to(dtype) for i in range(1, n)]


def _ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 64, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _random_units(models, batch, seq, seed, kind) -> dict[str, torch.Tensor]:
    """Per-unit maps for every slot of layer 0 that splits into ``kind`` units, and one of the last layer."""
    slot_list = model_slots(models[0])
    last = max(int(s.name.split(".")[1]) for s in slot_list if s.name.startswith("layers."))
    chosen = [s for s in slot_list if s.units(kind) and s.name.startswith("layers.0.")]
    chosen += [s for s in slot_list if s.units(kind) and s.name.startswith(f"layers.{last}.")][-1:]
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.randint(0, len(models), (batch, seq, s.units(kind)), generator=gen) for s in chosen}


def test_neuron_slots_are_gate_up_down_with_the_mlp_width():
    for arch in ("llama", "gpt2", "gpt_neox", "phi3"):
        model = make_tiny(arch)
        by = {s.name: s for s in model_slots(model)}
        width = 4 * 32 if arch == "gpt2" else 48  # GPT-2's n_inner defaults to 4 * n_embd
        assert by["layers.0.up"].neurons == width and by["layers.0.up"].neuron_side == "out"
        assert by["layers.0.down"].neurons == width and by["layers.0.down"].neuron_side == "in"
        if "layers.0.gate" in by:
            assert by["layers.0.gate"].neurons == width
        assert by["layers.0.q"].neurons == 0 and by["layers.0.up"].heads == 0
    gqa = {s.name: s for s in model_slots(make_tiny("llama"))}
    assert (gqa["layers.0.q"].heads, gqa["layers.0.k"].heads, gqa["layers.0.v"].heads) == (4, 2, 2)


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_per_neuron_maps_match_the_per_token_definition(model_type):
    models = _models(model_type, 3)
    ids = _ids(2, 7)
    gen = torch.Generator().manual_seed(5)
    source = torch.randint(0, 3, (2, 7, len(wg.slots(models[0]))), generator=gen)
    neurons = _random_units(models, 2, 7, seed=6, kind="neuron")
    assert "layers.0.up" in neurons and "layers.0.down" in neurons
    heads = _random_units(models, 2, 7, seed=7, kind="head")
    fast = wg.graft_forward(models, ids, source, head_source=heads, neuron_source=neurons)
    ref = per_token_forward(models, ids, source, head_source=heads, neuron_source=neurons)
    assert (fast - ref).abs().max().item() <= TOL
    plain = per_token_forward(models, ids, source, head_source=heads)
    assert (ref - plain).abs().max().item() > 100 * TOL  # the neuron maps matter


def _hybrid(base, donor, path: str, side: str, cols: torch.Tensor, bias_from_donor: bool):
    """A copy of ``base`` whose module ``path`` holds the donor's columns ``cols`` (output or
    input side) and, where asked, the donor's whole bias."""
    hybrid = copy.deepcopy(base)
    dst, src = hybrid.get_submodule(path), donor.get_submodule(path)
    with torch.no_grad():
        index = projections.out_index(dst, cols) if side == "out" else projections.in_index(dst, cols)
        dst.weight[index] = src.weight[index]
        if dst.bias is not None:
            if side == "out":
                dst.bias[cols] = src.bias[cols]
            elif bias_from_donor:
                dst.bias.copy_(src.bias)
    return hybrid


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gpt_neox", "phi3"])
@pytest.mark.parametrize("component", ["gate", "up", "down", "k"])
@torch.no_grad()
def test_one_unit_equals_a_hybrid_donor_holding_only_that_unit(model_type, component):
    """Grafting neuron 5 of gate/up/down (or k/v head 1: under GQA the shared key head) at the
    last position equals grafting the whole slot from a base copy that holds only that unit's
    columns of the donor: nothing leaks from other units; down's bias stays with the slot."""
    base, donor = _models(model_type, 2, torch.float64)  # one unit moves little: compare in float64
    by = {s.name: s for s in model_slots(base)}
    name = f"layers.1.{component}"
    if name not in by:
        pytest.skip(f"{model_type} has no {component}")
    slot = by[name]
    kind = slot.unit_kind()
    unit = 5 if kind == "neuron" else 1
    module = base.get_submodule(slot.parts[0].path)
    cols = slot.unit_columns(module, kind)[unit]
    hybrid = _hybrid(base, donor, slot.parts[0].path, slot.unit_side(kind), cols, bias_from_donor=False)
    ids = _ids(1, 6)
    names = wg.slots(base)
    source = torch.zeros(1, 6, len(names), dtype=torch.long)
    unit_map = torch.zeros(1, 6, slot.units(kind), dtype=torch.long)
    unit_map[0, -1, unit] = 1
    arg = {"neuron_source" if kind == "neuron" else "head_source": {name: unit_map}}
    per_unit = wg.graft_forward([base, donor], ids, source, **arg)
    whole = source.clone()
    whole[0, -1, names.index(name)] = 1
    via_hybrid = wg.graft_forward([base, hybrid], ids, whole)
    assert (per_unit - via_hybrid).abs().max().item() <= 1e-10
    assert (per_unit - base(ids).logits).abs().max().item() > 1e-4


def test_bad_neuron_source_is_refused():
    models = _models("llama", 2)
    ids = _ids(1, 4)
    source = torch.zeros(1, 4, len(wg.slots(models[0])), dtype=torch.long)
    with pytest.raises(ValueError, match="cannot be grafted per neuron"):
        wg.graft_forward(models, ids, source, neuron_source={"layers.0.q": torch.zeros(1, 4, 4, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"shape \[batch, seq, neurons\]"):
        wg.graft_forward(models, ids, source, neuron_source={"layers.0.up": torch.zeros(1, 4, 47, dtype=torch.long)})
