"""Exact cell maps against the per-token definition, on every architecture."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import HYBRID_CONFIGS, MOE_CONFIGS, TINY_CONFIGS, make_donor, make_tiny

import weightgraft as wg
from weightgraft.engine.cells import Cell, ScoredExample, exact_effects, example_cells
from weightgraft.engine.reference import CompositeModel, per_token_forward

ARCHS = sorted(TINY_CONFIGS)


def _examples() -> list[ScoredExample]:
    gen = torch.Generator().manual_seed(0)
    return [
        ScoredExample(tuple(torch.randint(3, 64, (n,), generator=gen).tolist()), position=n - 1, target=t)
        for n, t in ((5, 7), (4, 9))
    ]


def _per_token_logprob(models, composite, ex: ScoredExample, cells) -> float:
    n = ex.position + 1
    source = torch.zeros(1, n, len(wg.slots(models[0])), dtype=torch.long)
    for c in cells:
        source[0, c.position, c.slot] = 1
    logits = per_token_forward(models, torch.tensor([ex.input_ids[:n]]), source, composite=composite)
    return float(torch.log_softmax(logits[0, ex.position].double(), -1)[ex.target])


@pytest.mark.parametrize("model_type", ARCHS)
def test_single_cells_and_sets_match_the_per_token_definition(model_type):
    base = make_tiny(model_type, seed=0)
    models = [base, make_donor(base, seed=1)]
    composite = CompositeModel(models)
    examples = _examples()
    rng = random.Random(0)
    sets = []
    for ex in examples:
        cells = example_cells(base, ex)
        chosen = [[c] for c in rng.sample(cells, 8)] + [rng.sample(cells, 3), rng.sample(cells, 6)]
        sets.append(chosen)
    base_values, effects = exact_effects(models, examples, sets, pad_id=0)
    # float32: 1e-4, of the metric's scale where routing and chunked scans round (MoE, hybrids), as in test_engine
    scaled = model_type in MOE_CONFIGS or model_type in HYBRID_CONFIGS
    for ex, chosen, b, eff in zip(examples, sets, base_values, effects):
        ref_base = _per_token_logprob(models, composite, ex, [])
        tol = 1e-4 * max(1.0, abs(ref_base)) if scaled else 1e-4
        assert abs(float(b) - ref_base) < tol
        for cells, e in zip(chosen, eff):
            assert abs(float(e) - (_per_token_logprob(models, composite, ex, cells) - ref_base)) < tol
    assert max(float(e.abs().max()) for e in effects) > 1e-2  # grafting moved the metric


def test_cells_cover_every_slot_once_per_position_and_output_slots_at_the_end():
    base = make_tiny("gpt2", seed=0)
    ex = _examples()[0]
    cells = example_cells(base, ex)
    names = wg.slots(base)
    per_pos = {t: [c.slot for c in cells if c.position == t] for t in range(ex.position + 1)}
    assert len(per_pos[ex.position]) == len(names)
    assert all(len(per_pos[t]) == len(names) - 2 for t in range(ex.position))


@pytest.mark.parametrize("metric", ["logit_diff", "neg_kl_donor"])
def test_other_metrics_and_prefix_sharing_agree_with_whole_rows(metric):
    base = make_tiny("llama", seed=0)
    models = [base, make_donor(base, seed=1)]
    examples = [ScoredExample(e.input_ids, e.position, e.target, distractor=11) for e in _examples()]
    sets = [[[c] for c in example_cells(base, ex)] for ex in examples]
    shared = exact_effects(models, examples, sets, pad_id=0, metric=metric, chunk=37)
    whole = exact_effects(models, examples, sets, pad_id=0, metric=metric, share=False)
    for a, b in zip(shared[1], whole[1]):
        assert torch.allclose(a, b, atol=1e-4)
    everything = [[[Cell(t, s) for t in range(ex.position + 1) for s in range(len(wg.slots(base)))]] for ex in examples]
    if metric == "neg_kl_donor":  # grafting every cell is the donor: KL to it is 0
        b, eff = exact_effects(models, examples, everything, pad_id=0, metric=metric)
        assert torch.allclose(b + torch.cat(eff), torch.zeros(2, dtype=torch.float64), atol=1e-5)


@pytest.mark.parametrize("model_type", ["gpt2", "gemma2", "phi3"])
def test_group_of_cells_matches_the_per_token_definition(model_type):
    from weightgraft.engine.cells import group_cells

    base = make_tiny(model_type, seed=0)
    models = [base, make_donor(base, seed=1)]
    ex = _examples()[0]
    group = group_cells(base, ex, positions=[1, 2, 4], layers=[1], components=["o", "down", "unembed", "q"])
    names = wg.slots(base)
    assert {names[c.slot] for c in group} == {"layers.1.o", "layers.1.down", "layers.1.q", "unembed"}
    assert [c for c in group if names[c.slot] == "unembed"] == [Cell(4, names.index("unembed"))]
    _, (effect,) = exact_effects(models, [ex], [[group]], pad_id=0)
    composite = CompositeModel(models)
    ref = _per_token_logprob(models, composite, ex, group) - _per_token_logprob(models, composite, ex, [])
    assert abs(float(effect[0]) - ref) < 1e-4 and abs(ref) > 1e-3
