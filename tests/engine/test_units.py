"""Heads and neurons as units: the engine's per-neuron grafts against the per-token definition
on every architecture, single units against hand-made hybrid donors, and partial grafts with
one share per (position, slot, unit)."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import TINY_CONFIGS, make_tiny, random_ids, tiny_models

import weightgraft as wg
from weightgraft.engine import attribution, projections
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap

ARCHS = sorted(TINY_CONFIGS)
TOL = 1e-4


def _random_units(models, batch, seq, seed, kind) -> dict[str, torch.Tensor]:
    """Per-unit maps for every slot of the first layer that has ``kind`` units (layer 0, but for
    Nemotron-H's one-sublayer blocks), and one of the last layer."""
    slot_list = model_slots(models[0])
    last = max(int(s.name.split(".")[1]) for s in slot_list if s.name.startswith("layers."))
    first = min(int(s.name.split(".")[1]) for s in slot_list if s.units(kind) and s.name.startswith("layers."))
    chosen = [s for s in slot_list if s.units(kind) and s.name.startswith(f"layers.{first}.")]
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
    models = tiny_models(model_type, 3)
    ids = random_ids(2, 7)
    gen = torch.Generator().manual_seed(5)
    source = torch.randint(0, 3, (2, 7, len(wg.slots(models[0]))), generator=gen)
    neurons = _random_units(models, 2, 7, seed=6, kind="neuron")
    dense = any(s.name.endswith(".up") for s in model_slots(models[0]))  # else every MLP is a bank: its shared experts
    assert {n.rsplit(".", 1)[1] for n in neurons} >= ({"up", "down"} if dense else {"shared_up", "shared_down"})
    heads = _random_units(models, 2, 7, seed=7, kind="head")
    fast = wg.graft_forward(models, ids, source, head_source=heads, neuron_source=neurons)
    ref = per_token_forward(models, ids, SourceMap(source, heads, neurons))
    # Qwen3.5-MoE's float32 rounding (GDN kernels, router softmax) is ~1e-4 of its logit scale, as in test_engine
    tol = TOL * max(1.0, ref.abs().max().item()) if model_type.startswith("qwen3_5_moe") else TOL
    assert (fast - ref).abs().max().item() <= tol
    plain = per_token_forward(models, ids, SourceMap(source, heads))
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
    base, donor = tiny_models(model_type, 2, torch.float64)  # one unit moves little: compare in float64
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
    ids = random_ids(1, 6)
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
    models = tiny_models("llama", 2)
    ids = random_ids(1, 4)
    source = torch.zeros(1, 4, len(wg.slots(models[0])), dtype=torch.long)
    with pytest.raises(ValueError, match="cannot be grafted per neuron"):
        wg.graft_forward(models, ids, source, neuron_source={"layers.0.q": torch.zeros(1, 4, 4, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"shape \[batch, seq, neurons\]"):
        wg.graft_forward(models, ids, source, neuron_source={"layers.0.up": torch.zeros(1, 4, 47, dtype=torch.long)})


# ---- partial grafts and attribution per unit ---------------------------------------------------

PARTIAL_ARCHS = ["llama", "gpt2", "gpt_neox", "phi3", "gemma3_text"]


def _scored(batch: int = 2, seq: int = 6):
    ids = random_ids(batch, seq, seed=3)
    return ids, torch.full((batch,), seq - 1), torch.tensor([7, 11][:batch])


@pytest.mark.parametrize("model_type", PARTIAL_ARCHS)
@pytest.mark.parametrize("kind", ["head", "neuron"])
def test_unit_gradients_sum_to_the_cell_gradient(model_type, kind):
    """Each split slot's unit gradients plus its rest (o's / down's bias) equal the unsplit
    cell's gradient; the backward-only gradient equals autograd through the mixed forward."""
    base, donor = tiny_models(model_type, 2, torch.float64)
    pair = PartialGraft(base, donor)
    ids, pos, targets = _scored()
    cells = attribution.graft_attribution(pair, ids, pos, targets=targets)
    split, units = attribution.graft_unit_attribution(pair, ids, pos, targets=targets, kind=kind)
    names = [s.name for s in pair.slots]
    assert set(units) == set(attribution.unit_slots(pair, kind)) and units
    for name, g in units.items():
        s = names.index(name)
        assert torch.allclose(g.sum(-1) + split[..., s], cells[..., s], atol=1e-10, rtol=1e-8)
        assert g.abs().max() > 1e-6
    others = [i for i, n in enumerate(names) if n not in units]
    assert torch.allclose(split[..., others], cells[..., others], atol=1e-12)
    # backward-only (at a = 0) against plain autograd through the mixed forward
    alpha = torch.zeros(2, ids.shape[1], len(names), dtype=torch.float64, requires_grad=True)
    ua = {n: torch.zeros(2, ids.shape[1], g.shape[-1], dtype=torch.float64, requires_grad=True) for n, g in units.items()}
    logits = pair.forward(ids, alpha, logit_positions=pos[:, None], unit_alpha=ua, first_order=False)[:, 0]
    value = torch.log_softmax(logits, -1)[torch.arange(2), targets].sum()
    grads = torch.autograd.grad(value, [alpha, *ua.values()])
    assert torch.allclose(grads[0], split, atol=1e-10)
    for g, auto in zip(units.values(), grads[1:]):
        assert torch.allclose(auto, g, atol=1e-10)


@pytest.mark.parametrize("model_type", PARTIAL_ARCHS)
@pytest.mark.parametrize("component", ["q", "k", "o", "up", "down"])
@torch.no_grad()
def test_a_unit_at_share_one_equals_its_integer_graft(model_type, component):
    """The partial graft with one unit's share at 1 is the engine's graft of that unit (and a
    split o/down slot's own share at 1 grafts its bias alone): the unit cells that attribution
    estimates are the cells that exact maps and search graft."""
    base, donor = tiny_models(model_type, 2, torch.float64)
    pair = PartialGraft(base, donor)
    names = [s.name for s in pair.slots]
    name = f"layers.1.{component}"
    slot = pair.slots[names.index(name)]
    kind = slot.unit_kind()
    ids = random_ids(1, 6, seed=4)
    n = slot.units(kind)
    for unit in (0, n - 1):
        alpha = torch.zeros(1, 6, len(names), dtype=torch.float64)
        ua = torch.zeros(1, 6, n, dtype=torch.float64)
        ua[0, 4, unit] = 1.0
        mixed = pair.forward(ids, alpha, unit_alpha={name: ua})
        source = torch.zeros(1, 6, len(names), dtype=torch.long)
        arg = "neuron_source" if kind == "neuron" else "head_source"
        engine = wg.graft_forward([base, donor], ids, source, **{arg: {name: ua.long()}})
        assert (mixed - engine).abs().max().item() <= 1e-10
        assert (engine - base(ids).logits).abs().max().item() > 1e-6
    # the rest of a split slot (o/down bias; nothing for q/k/up) at share one
    alpha = torch.zeros(1, 6, len(names), dtype=torch.float64)
    alpha[0, 4, names.index(name)] = 1.0
    mixed = pair.forward(ids, alpha, unit_alpha={name: torch.zeros(1, 6, n, dtype=torch.float64)})
    source = (alpha > 0).long()
    arg = "neuron_source" if kind == "neuron" else "head_source"
    engine = wg.graft_forward([base, donor], ids, source, **{arg: {name: torch.zeros(1, 6, n, dtype=torch.long)}})
    assert (mixed - engine).abs().max().item() <= 1e-10


def test_bad_unit_alpha_is_refused():
    base, donor = tiny_models("llama", 2)
    pair = PartialGraft(base, donor)
    ids = random_ids(1, 4)
    alpha = torch.zeros(1, 4, len(pair.slots))
    with pytest.raises(ValueError, match="has no units"):
        pair.forward(ids, alpha, unit_alpha={"layers.0.attn_norm": torch.zeros(1, 4, 4)})
    with pytest.raises(ValueError, match=r"shape \[batch, seq, neurons\]"):
        pair.forward(ids, alpha, unit_alpha={"layers.0.up": torch.zeros(1, 4, 4)})
    with pytest.raises(ValueError, match="kind must be"):
        attribution.graft_unit_attribution(pair, ids, torch.tensor([3]), targets=torch.tensor([5]), kind="cell")


# ---- exact effects of unit cells ----------------------------------------------------------------

from weightgraft.engine.cells import (  # noqa: E402
    REST,
    Cell,
    ScoredExample,
    cell_name,
    exact_effects,
    has_rest,
    parse_cell_name,
)
from weightgraft.engine.sharing.depth import cost_batches, item_starts  # noqa: E402


def test_cell_names_round_trip():
    for slot, unit, name in [("layers.3.o", -1, "layers.3.o"), ("layers.3.o", 2, "layers.3.o/h2"),
                             ("layers.0.up", 17, "layers.0.up/n17"), ("layers.1.down", REST, "layers.1.down/bias")]:
        assert cell_name(slot, unit) == name and parse_cell_name(name) == (slot, unit)
    with pytest.raises(ValueError, match="not a cell name"):
        parse_cell_name("layers.3.o/x2")


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "phi3"])
@torch.no_grad()
def test_exact_effects_of_unit_cells_are_their_grafts(model_type):
    """Unit cells (and a split slot's rest) through exact_effects equal each set's graft through
    the engine, in one pass or one item per pass; all units plus the rest of a cell equal the
    whole cell; a small unit budget splits the passes."""
    import weightgraft.engine.cells as cells_mod

    base, donor = tiny_models(model_type, 2, torch.float64)
    names = wg.slots(base)
    slots = {s.name: s for s in model_slots(base)}
    ids = random_ids(1, 6, seed=8)[0]
    ex = ScoredExample(tuple(ids.tolist()), position=5, target=9)
    up, down, o = names.index("layers.0.up"), names.index("layers.0.down"), names.index("layers.0.o")
    n_up, n_down = slots["layers.0.up"].neurons, slots["layers.0.down"].neurons
    sets = [[Cell(3, up, k) for k in (4, 5, 6)], [Cell(2, down, 0), Cell(4, o, 1)], [Cell(4, down, REST)],
            [Cell(4, down, k) for k in range(n_down)] + [Cell(4, down, REST)], [Cell(4, down)],
            [Cell(1, up, k) for k in range(0, n_up, 2)]]
    base_metric, (effects,) = exact_effects([base, donor], [ex], [sets], pad_id=0, chunk=4)
    items = [cells_mod._item(ex, c, model_slots(base)) for c in sets]
    small = cost_batches(items, item_starts(base, items), base.config.num_hidden_layers, 4, unit_budget=200)
    assert max(len(c) for c in small) < len(sets) and sorted(sum(small, [])) == list(range(len(sets)))
    _, (again,) = exact_effects([base, donor], [ex], [sets], pad_id=0, chunk=1)  # one item per pass
    assert torch.allclose(effects, again, atol=1e-12)
    logp = lambda logits: torch.log_softmax(logits[0, -1].double(), -1)[9]  # noqa: E731
    assert abs(base_metric[0].item() - logp(base(ids[None]).logits).item()) < 1e-10
    for cells, effect in zip(sets, effects.tolist()):
        source = torch.zeros(1, 6, len(names), dtype=torch.long)
        neurons = {"layers.0.up": torch.zeros(1, 6, n_up, dtype=torch.long),
                   "layers.0.down": torch.zeros(1, 6, n_down, dtype=torch.long)}
        heads = {"layers.0.o": torch.zeros(1, 6, slots["layers.0.o"].heads, dtype=torch.long)}
        for c in cells:
            name = names[c.slot]
            maps = neurons.get(name, heads.get(name))
            if c.unit >= 0:
                maps[0, c.position, c.unit] = 1
            else:
                source[0, c.position, c.slot] = 1
                if c.unit == -1:
                    maps[0, c.position] = 1
        got = logp(wg.graft_forward([base, donor], ids[None], source, head_source=heads, neuron_source=neurons))
        assert abs(effect - (got.item() - base_metric[0].item())) < 1e-10
        rest_only = cells == [Cell(4, down, REST)]
        assert (abs(effect) > 1e-8) == (not rest_only or has_rest(base, slots["layers.0.down"]))
    assert abs(effects[3].item() - effects[4].item()) < 1e-10
