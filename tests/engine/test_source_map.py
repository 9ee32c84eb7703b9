"""One object for what serves what in a pass: a ``SourceMap`` (slots, heads, neurons) gives the
same logits as the three maps passed apart, on every architecture whose slots split into units;
its unit maps are sorted into heads and neurons by the slot table (GPT-2's ``c_fc``, Phi-3's
fused ``gate_up_proj``), never by a slot's name; and it cannot be given twice."""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_ids, tiny_models

import weightgraft as wg
from weightgraft.engine.architectures import Units, model_slots
from weightgraft.engine.sharing.prefix import GraftItem, pad_segments, prefix_forward, segment
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError


def _maps(models, batch: int, seq: int, seed: int) -> SourceMap:
    gen = torch.Generator().manual_seed(seed)
    slot_list = model_slots(models[0])
    slots = torch.randint(0, len(models), (batch, seq, len(slot_list)), generator=gen)
    heads, neurons = {}, {}
    for slot in slot_list:
        if slot.name.startswith("layers.1."):
            kind = slot.unit_kind()
            if kind is not None:
                m = torch.randint(0, len(models), (batch, seq, slot.units(kind)), generator=gen)
                (heads if kind == Units.HEAD else neurons)[slot.name] = m
    return SourceMap(slots, heads, neurons)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3", "gpt_neox"])
def test_a_source_map_equals_its_maps_passed_apart(arch):
    models = tiny_models(arch, 3, torch.float64)
    ids = random_ids(2, 6, seed=1)
    maps = _maps(models, 2, 6, seed=2)
    assert maps.heads and maps.neurons
    with torch.no_grad():
        one = wg.graft_forward(models, ids, maps)
        apart = wg.graft_forward(models, ids, maps.slots, head_source=dict(maps.heads),
                                 neuron_source=dict(maps.neurons))
        whole = wg.graft_forward(models, ids, maps.slots)
    assert (one - apart).abs().max().item() <= 1e-12
    assert (one - whole).abs().max().item() > 1e-3  # the unit maps took part


@pytest.mark.parametrize("arch", ["gpt2", "phi3"])
def test_unit_maps_are_sorted_by_the_slot_table_not_by_name(arch):
    """Padded rows (prefix sharing's path) hand their merged unit maps to ``from_units``: a
    neuron map of an MLP slot lands in ``neurons`` and a head map of ``o`` in ``heads``."""
    models = tiny_models(arch, 2, torch.float64)
    maps = _maps(models, 1, 5, seed=3)
    row = SourceMap(maps.slots[0], {k: v[0] for k, v in maps.heads.items()},
                    {k: v[0] for k, v in maps.neurons.items()})
    item = GraftItem(random_ids(1, 5, seed=4)[0].tolist(), row)
    assert item.unit_maps().keys() == {**row.heads, **row.neurons}.keys()
    slot_index = {s.name: i for i, s in enumerate(model_slots(models[0]))}
    widths = {name: int(m.shape[-1]) for name, m in sorted(item.unit_maps().items())}
    batch = pad_segments([segment(item, 0, len(item), widths, slot_index)], pad_id=0, left=False)
    sorted_back = batch.source_map(models[0])
    assert set(sorted_back.heads) == set(maps.heads) and set(sorted_back.neurons) == set(maps.neurons)
    with torch.no_grad():
        want = wg.graft_forward(models, torch.tensor([list(item.input_ids)]), maps)[:, -1]
        got = prefix_forward(models, [item], pad_id=0)
    assert (got[:, 0] - want).abs().max().item() <= 1e-12


def test_a_source_map_is_one_argument_and_names_real_slots():
    models = tiny_models("llama", 2)
    maps = _maps(models, 1, 4, seed=5)
    ids = random_ids(1, 4)
    with pytest.raises(GraftArgumentError, match="not both"):
        wg.graft_forward(models, ids, maps, head_source=dict(maps.heads))
    with pytest.raises(GraftArgumentError, match="both head by head and neuron by neuron"):
        SourceMap(maps.slots, {"layers.1.o": maps.heads["layers.1.o"]}, {"layers.1.o": maps.heads["layers.1.o"]})
    with pytest.raises(GraftArgumentError, match="'layers.9.o', which is not a slot"):
        SourceMap.from_units(maps.slots, {"layers.9.o": maps.heads["layers.1.o"]}, model_slots(models[0]))
