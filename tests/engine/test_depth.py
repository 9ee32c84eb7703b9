"""Depth sharing (engine/sharing/depth.py) against ``graft_forward`` of each row whole, in float64."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import RUNS_WHOLE, TINY_CONFIGS, make_donor, make_tiny

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.cells import Cell, ScoredExample, exact_effects, example_cells
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.sharing.depth import (
    MIN_ROWS,
    SLACK,
    DepthStats,
    cost_batches,
    depth_forward,
    item_starts,
)
from weightgraft.engine.sharing.prefix import GraftItem
from weightgraft.engine.source_map import SourceMap
from weightgraft.planning.depth_states import depth_state_bytes

# the hybrids' caches hold recurrent layers, which depth sharing does not share: their rows run whole
# (exact: tests/engine/test_mixers.py)
ARCHS = sorted(m for m in TINY_CONFIGS if m not in RUNS_WHOLE)
N_LAYERS = 4


def _models(model_type: str) -> list[torch.nn.Module]:
    base = make_tiny(model_type, seed=0, n_layers=N_LAYERS).double()
    return [base, make_donor(base, seed=1)]


def _unit_maps(slot_list, n: int, rng: random.Random) -> tuple[dict, dict]:
    """One head of a q or o slot and one neuron of an up or down slot, at a random position."""
    heads, neurons = {}, {}
    for kind, names, out in (("head", ("q", "o"), heads), ("neuron", ("up", "down"), neurons)):
        options = [s for s in slot_list if s.name.rsplit(".", 1)[-1] in names and s.units(kind)]
        slot = rng.choice(options)
        maps = torch.zeros(n, slot.units(kind), dtype=torch.long)
        maps[rng.randrange(n), rng.randrange(slot.units(kind))] = 1
        out[slot.name] = maps
    return heads, neurons


def _items(models, seed: int = 0) -> list[GraftItem]:
    """Per example (lengths 9 and 5): the base, single cells anywhere (embedding, every layer,
    the output slots at the scored position), sets of cells, and head / neuron grafts."""
    slot_list = model_slots(models[0])
    n_slots = len(slot_list)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    items = []
    for n in (9, 5):
        ids = torch.randint(3, 64, (n,), generator=gen).tolist()
        base = torch.zeros(n, n_slots, dtype=torch.long)
        items.append(GraftItem(ids, SourceMap(base)))
        for _ in range(8):
            source = base.clone()
            for _ in range(rng.choice((1, 1, 1, 3, 6))):
                source[rng.randrange(n), rng.randrange(n_slots)] = 1
            items.append(GraftItem(ids, SourceMap(source)))
        for slot in (0, n_slots - 1, n_slots - 2):  # embed, unembed, final norm
            source = base.clone()
            source[n - 1 if slot else rng.randrange(n), slot] = 1
            items.append(GraftItem(ids, SourceMap(source)))
        for _ in range(3):
            heads, neurons = _unit_maps(slot_list, n, rng)
            items.append(GraftItem(ids, SourceMap(base, heads, neurons)))
    return items


def _whole(models, items: list[GraftItem]) -> torch.Tensor:
    return torch.stack([
        wg.graft_forward(models, torch.tensor([it.input_ids]), it.maps.batch_of_one())[0, -1]
        for it in items
    ])


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_depth_sharing_equals_whole_rows_in_float64(model_type):
    """Every item, run from its first position and first layer, equals its whole row to float64
    rounding; the rows are passes of a few rows each (several starts per pass)."""
    models = _models(model_type)
    items = _items(models)
    with float64_exact(models):
        stats = DepthStats()
        shared = depth_forward(models, items, pad_id=0, chunk=7, stats=stats)[:, 0]
        whole = _whole(models, items)
    assert (shared - whole).abs().max().item() <= 1e-12
    moved = (whole - whole[0]).abs().amax(-1)[1:9] > 1e-3  # a cell may be a no-op (unembed early)
    assert moved.sum() >= 4
    starts = item_starts(models[0], items)
    assert {s.layer for s in starts} >= {-1, 0, N_LAYERS - 1} and len({s.layer for s in starts}) > 3
    assert stats.passes > 3 and stats.peak_bytes > 0


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "gpt_neox", "phi3"])
@torch.no_grad()
def test_a_set_without_one_cell_shares_the_whole_set(model_type):
    """Refinement's rows: the set without each of its cells, run from that cell on the whole
    set's states (reference 1, not the base: it leaves less work), equal their whole rows."""
    models = _models(model_type)
    n_slots = len(wg.slots(models[0]))
    rng = random.Random(1)
    n = 8
    ids = torch.randint(3, 64, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    whole_set = torch.zeros(n, n_slots, dtype=torch.long)
    cells = list(dict.fromkeys((rng.randrange(n), rng.randrange(n_slots)) for _ in range(14)))
    for t, s in cells:
        whole_set[t, s] = 1
    items = []
    for t, s in cells:
        source = whole_set.clone()
        source[t, s] = 0
        items.append(GraftItem(ids, SourceMap(source)))
    reference = GraftItem(ids, SourceMap(whole_set))
    starts = item_starts(models[0], items, [reference])
    assert sum(s.reference == 1 for s in starts) > len(items) // 2
    with float64_exact(models):
        shared = depth_forward(models, items, pad_id=0, chunk=5, references=[reference])[:, 0]
        whole = _whole(models, items)
    assert (shared - whole).abs().max().item() <= 1e-12


@pytest.mark.parametrize("part", ["residuals", "keys"])
@torch.no_grad()
def test_the_states_put_in_are_what_the_rows_use(monkeypatch, part):
    """Null: the same rows with the shared residual streams (or the cached keys) off by 0.1%
    are off far above rounding, so the comparison above is not blind to them."""
    import dataclasses

    import weightgraft.engine.sharing.depth as depth

    def scaled(states):
        if part == "residuals":
            return dataclasses.replace(states, residuals={
                r: {j: t * 1.001 for j, t in per.items()} for r, per in states.residuals.items()})
        return dataclasses.replace(states, keys=[k * 1.001 for k in states.keys])

    models = _models("mistral")
    items = _items(models, seed=4)
    real = depth._reference_states
    monkeypatch.setattr(depth, "_reference_states", lambda *a, **k: scaled(real(*a, **k)))
    with float64_exact(models):
        off = depth_forward(models, items, pad_id=0, chunk=7)[:, 0]
        whole = _whole(models, items)
    assert (off - whole).abs().max().item() > 1e-6


@torch.no_grad()
def test_blocks_below_every_start_do_not_run():
    """Cells of the last layer at the first position: layer 0's q projection sees the base's one
    pass over the example (its residual stream), never a cell's row; the prefix-only path runs
    every block for every row."""
    models = _models("llama")
    names = wg.slots(models[0])
    ex = ScoredExample(tuple(range(5, 12)), position=6, target=9)
    last = [Cell(0, s) for s, name in enumerate(names) if name.startswith(f"layers.{N_LAYERS - 1}.")]
    seen: list[tuple[int, int]] = []
    hook = models[0].model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda _m, args, _out: seen.append(tuple(args[0].shape[:2])))
    try:
        exact_effects(models, [ex], [[[c] for c in last]], pad_id=0, share="depth")
        depth_calls = list(seen)
        exact_effects(models, [ex], [[[c] for c in last]], pad_id=0, share="prefix")
    finally:
        hook.remove()
    assert depth_calls == [(1, 7)]
    assert sum(b * t for b, t in seen[1:]) >= len(last) * 7


@pytest.mark.parametrize("metric", ["first_logprob", "neg_kl_donor"])
@torch.no_grad()
def test_exact_effects_paths_agree(metric):
    """exact_effects through depth sharing, the prefix-only path and whole rows: one answer."""
    models = _models("gemma3_text")
    gen = torch.Generator().manual_seed(3)
    examples = [ScoredExample(tuple(torch.randint(3, 64, (n,), generator=gen).tolist()), n - 1, 7) for n in (7, 5)]
    rng = random.Random(3)
    sets = []
    for ex in examples:
        cells = example_cells(models[0], ex)
        sets.append([[c] for c in rng.sample(cells, 20)] + [rng.sample(cells, 5), rng.sample(cells, 9)])
    with float64_exact(models):
        results = {share: exact_effects(models, examples, sets, pad_id=0, metric=metric, chunk=9, share=share)
                   for share in ("depth", "prefix", False)}
    for share in ("prefix", False):
        torch.testing.assert_close(results["depth"][0], results[share][0], atol=1e-12, rtol=0)
        for a, b in zip(results["depth"][1], results[share][1]):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert max(float(e.abs().max()) for e in results["depth"][1]) > 1e-3


def test_passes_are_cut_by_work_and_never_mix_position_zero():
    """Every item in exactly one pass; a pass of MIN_ROWS or more is padded to at most SLACK
    times its rows' own work, and position-0 rows run apart."""
    models = _models("llama")
    items = _items(models, seed=5) * 4
    starts = item_starts(models[0], items)
    passes = cost_batches(items, starts, N_LAYERS, chunk=64)
    assert sorted(sum(passes, [])) == list(range(len(items)))
    for rows in passes:
        work = [(len(items[i]) - starts[i].position, N_LAYERS - max(starts[i].layer, 0)) for i in rows]
        padded = len(rows) * max(w[0] for w in work) * max(w[1] for w in work)
        if len(rows) > MIN_ROWS:
            assert padded <= SLACK * sum(a * b for a, b in work)
        assert len({starts[i].position == 0 for i in rows}) == 1
    assert len(passes) > 2


@torch.no_grad()
def test_state_bytes_bound_what_a_run_holds():
    """Rows of one first position (a pass spans the row): the plan's figure bounds the peak."""
    models = _models("qwen2")
    names = wg.slots(models[0])
    ex = ScoredExample(tuple(range(5, 14)), position=8, target=9)
    cells = [[Cell(4, s)] for s, name in enumerate(names) if name.startswith("layers.")]
    stats = DepthStats()
    exact_effects(models, [ex], [cells], pad_id=0, chunk=16, stats=stats)
    bound = depth_state_bytes(models[0].config, n_references=2, seq_len=9, chunk=16, dtype_bytes=8)
    assert stats.passes > 1 and 0 < stats.peak_bytes <= bound
