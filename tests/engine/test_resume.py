"""Rows resumed from kept reference states (engine/sharing/resume.py) against ``graft_forward``
of each row whole, in float64; and a null: kept states that are off are seen."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import make_donor, make_tiny

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.sharing.prefix import GraftItem
from weightgraft.engine.sharing.resume import keep_states, resumable, resume, resume_start
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError

N_LAYERS = 4


def _models(model_type: str) -> list[torch.nn.Module]:
    base = make_tiny(model_type, seed=0, n_layers=N_LAYERS).double()
    return [base, make_donor(base, seed=1)]


def _rows(models, n: int, seed: int) -> tuple[list[int], list[GraftItem]]:
    """Rows of one prompt: single cells anywhere, sets of cells over base 0 and over base 1
    (closer to the all-1 reference), head and neuron maps, and the references themselves."""
    slot_list = model_slots(models[0])
    n_slots = len(slot_list)
    rng = random.Random(seed)
    ids = torch.randint(3, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    rows = []
    for base in (0, 1, 0, 1, 0):
        source = torch.full((n, n_slots), base, dtype=torch.long)
        for _ in range(rng.choice((1, 2, 5))):
            source[rng.randrange(n), rng.randrange(n_slots)] = 1 - base
        rows.append(GraftItem(ids, SourceMap(source)))
    source = torch.zeros(n, n_slots, dtype=torch.long)
    source[n - 1, n_slots - 1] = 1  # the unembedding at the last position only
    rows.append(GraftItem(ids, SourceMap(source)))
    heads = [s for s in slot_list if s.name.endswith(".o") and s.units("head")][-1]
    ups = [s for s in slot_list if s.name.endswith(".up") and s.units("neuron")][1]
    h = torch.zeros(n, heads.units("head"), dtype=torch.long)
    h[n - 2, 1] = 1
    u = torch.zeros(n, ups.units("neuron"), dtype=torch.long)
    u[n // 2, 3] = 1
    rows.append(GraftItem(ids, SourceMap(torch.zeros(n, n_slots, dtype=torch.long), {heads.name: h}, {ups.name: u})))
    rows += [GraftItem(ids, SourceMap(torch.full((n, n_slots), r, dtype=torch.long))) for r in (0, 1)]
    return ids, rows


def _whole(models, item: GraftItem) -> torch.Tensor:
    return wg.graft_forward(models, torch.tensor([item.input_ids]), item.maps.batch_of_one())[0, -1]


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gpt2", "phi3"])
@torch.no_grad()
def test_resumed_rows_equal_whole_rows_in_float64(model_type):
    models = _models(model_type)
    ids, rows = _rows(models, 9, seed=3)
    n_slots = len(model_slots(models[0]))
    pre, sft = (GraftItem(ids, SourceMap(torch.full((9, n_slots), r, dtype=torch.long))) for r in (0, 1))
    with float64_exact(models):
        first, kept = keep_states(models, [rows[0], pre, sft], kept=[1, 2], pad_id=0)
        whole = torch.stack([_whole(models, r) for r in rows])
        resumed = torch.stack([resume(models, r, kept, pad_id=0)[0, 0] for r in rows])
        assert (first[:, 0] - torch.stack([whole[0], whole[-2], whole[-1]])).abs().max().item() <= 1e-12
    assert (resumed - whole).abs().max().item() <= 1e-12
    starts = [resume_start(models[0], r, kept) for r in rows]
    # rows painted over base 1 start from the SFT reference; most rows skip some work
    assert {s.reference for s in starts} == {0, 1}
    assert sum(s.position > 0 or s.layer > 0 for s in starts) >= len(rows) // 2
    moved = (whole[:-2] - whole[-2]).abs().amax(-1) > 1e-3
    assert moved.sum() >= 4


@torch.no_grad()
def test_kept_states_that_are_off_are_seen():
    """Null: with the kept residual streams and keys off by 0.1%, resumed rows are off far
    above rounding, so the comparison above is not blind to the states."""
    models = _models("llama")
    ids, rows = _rows(models, 9, seed=4)
    n_slots = len(model_slots(models[0]))
    pre = GraftItem(ids, SourceMap(torch.zeros(9, n_slots, dtype=torch.long)))
    with float64_exact(models):
        _, kept = keep_states(models, [pre], kept=[0], pad_id=0)
        for per in kept.states.residuals.values():
            for t in per.values():
                t.mul_(1.001)
        for t in kept.states.keys:
            t.mul_(1.001)
        late = [r for r in rows if resume_start(models[0], r, kept).layer > 0 or resume_start(models[0], r, kept).position > 0]
        gaps = [(resume(models, r, kept, pad_id=0)[0, 0] - _whole(models, r)).abs().max().item() for r in late]
    assert late and max(gaps) > 1e-6


def test_rows_of_other_tokens_and_half_models_are_refused():
    models = _models("llama")
    n_slots = len(model_slots(models[0]))
    a = GraftItem([3, 4, 5], SourceMap(torch.zeros(3, n_slots, dtype=torch.long)))
    b = GraftItem([3, 4, 6], SourceMap(torch.zeros(3, n_slots, dtype=torch.long)))
    _, kept = keep_states(models, [a], kept=[0], pad_id=0)
    with pytest.raises(GraftArgumentError, match="same tokens"):
        resume(models, b, kept, pad_id=0)
    half = [m.to(torch.bfloat16) for m in _models("llama")]
    assert resumable(models[0]) and not resumable(half[0])
    with pytest.raises(GraftArgumentError, match="cannot resume"):
        keep_states(half, [a], kept=[0], pad_id=0)
    with pytest.raises(GraftArgumentError, match="models that computed them"):
        resume(half, a, kept, pad_id=0)  # other models than the states came from
    with pytest.raises(GraftArgumentError, match="models that computed them"):
        resume(models[::-1], a, kept, pad_id=0)
