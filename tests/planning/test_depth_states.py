"""``depth_state_bytes`` (what the localize plan adds for depth sharing) against what
``depth_forward`` held (``DepthStats.peak_bytes``) on tiny random models, and the per-pass
metric values that keep an ``exact_effects`` call from holding every set's logits."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import make_donor, make_tiny

import weightgraft.engine.cells as cells_mod
from weightgraft.engine.architectures import Units, model_slots
from weightgraft.engine.cells import Cell, ScoredExample, exact_effects, example_cells
from weightgraft.engine.sharing.depth import DepthStats
from weightgraft.planning.depth_states import cached_positions, depth_state_bytes

LENGTHS = (12, 12, 11)
CHUNK = 16  # below every call's items: passes hold CHUNK rows, as at real scale (chunk 512, 30 layers)


def _setup(model_type: str) -> tuple[list[torch.nn.Module], list[ScoredExample]]:
    base = make_tiny(model_type, seed=0, n_layers=4)
    gen = torch.Generator().manual_seed(0)
    examples = [ScoredExample(tuple(torch.randint(3, 64, (n,), generator=gen).tolist()), n - 1, 7) for n in LENGTHS]
    return [base, make_donor(base, seed=1)], examples


def _unit_cells(model: torch.nn.Module, ex: ScoredExample, units: Units) -> list[list[Cell]]:
    """Every other unit of every split slot at every position, one cell each."""
    slot_list = model_slots(model)
    return [[Cell(p, i, u)] for p in range(ex.position + 1) for i, s in enumerate(slot_list)
            for u in range(0, s.units(units), 2)]


def _ratio(models, examples, sets, n_references: int) -> float:
    stats = DepthStats()
    exact_effects(models, examples, sets, pad_id=0, chunk=CHUNK, stats=stats)
    assert stats.passes > 3 and max(stats.pass_sizes) == CHUNK
    predicted = depth_state_bytes(models[0].config, n_references, max(LENGTHS), CHUNK, dtype_bytes=4)
    return predicted / stats.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("model_type,units", [("llama", None), ("gemma3_text", None), ("gpt_neox", None),
                                              ("qwen3", Units.HEAD), ("llama", Units.NEURON)])
@torch.no_grad()
def test_single_cell_maps_hold_what_the_plan_predicts(model_type, units):
    """Exact single-cell maps (every cell, or every other unit of every split slot) of three
    prompts: the bases are the references (a single cell shares with its base alone). GQA,
    a sliding window of 3 (gemma3: its layers keep 2 positions), parallel attention (gpt_neox)."""
    models, examples = _setup(model_type)
    if units is None:
        sets = [[[c] for c in example_cells(models[0], ex)] for ex in examples]
    else:
        sets = [_unit_cells(models[0], ex, units) for ex in examples]
    ratio = _ratio(models, examples, sets, n_references=len(examples))
    assert 0.85 <= ratio <= 1.15, ratio


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gpt_neox"])
@torch.no_grad()
def test_a_refinement_round_holds_about_what_the_plan_predicts(model_type):
    """A refinement round (a set of 24 cells without each of them) in two prompts: two
    references a prompt (the base and the whole set). The figure is looser here: the whole
    sets hold residuals only at the layers their rows start at (it counts every layer), and a
    pass mixing first positions spans a few positions more than a row (it counts one row)."""
    models, examples = _setup(model_type)
    rng = random.Random(0)
    sets = []
    for ex in examples[:2]:
        chosen = rng.sample(example_cells(models[0], ex), 24)
        sets.append([chosen[:i] + chosen[i + 1 :] for i in range(len(chosen))])
    ratio = _ratio(models, examples[:2], sets, n_references=4)
    assert 0.8 <= ratio <= 1.25, ratio


def test_sliding_window_layers_keep_their_window():
    """gemma3's sliding layers keep window - 1 positions of a pass, full layers all of them:
    counting every layer as full would predict far more than a sliding model holds."""
    models, _ = _setup("gemma3_text")
    config = models[0].config
    assert cached_positions(config, 12) == [min(12, config.sliding_window - 1)] * 4
    full = make_tiny("llama", seed=0, n_layers=4).config
    assert cached_positions(full, 12) == [12] * 4


@pytest.mark.slow
@torch.no_grad()
def test_exact_effects_keeps_metric_values_not_logits(monkeypatch):
    """Each pass's logits become metric values before the next pass runs: no call of the metric
    sees more rows than a pass (it saw every item at once before, [items, vocab] in float64)."""
    models, examples = _setup("llama")
    sets = [[[c] for c in example_cells(models[0], ex)] for ex in examples]
    seen: list[int] = []
    own = cells_mod.metric_values

    def counted(logits, *args, **kwargs):
        seen.append(int(logits.shape[0]))
        return own(logits, *args, **kwargs)

    monkeypatch.setattr(cells_mod, "metric_values", counted)
    for share in ("depth", "prefix"):
        seen.clear()
        exact_effects(models, examples, sets, pad_id=0, chunk=CHUNK, share=share)
        assert len(seen) > 3 and max(seen) <= CHUNK
