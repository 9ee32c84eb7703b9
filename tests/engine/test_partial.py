"""Partial grafts against the per-token definition with mixed weights, on every architecture."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_CONFIGS, WITH_BLOCK_SCALES, WITH_MIXERS, random_ids, tiny_models

import weightgraft as wg
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.reference import per_token_mixed_forward

# Apertus' xIELU activation is not affine in its weights: partial grafts refuse it
# (test_non_affine_activation_is_refused_in_one_line in test_partial.py)
# Apertus (xIELU) and the hybrids (a recurrent mixer) refuse partial grafts: tested where they are
ARCHS = sorted(m for m in TINY_CONFIGS if m != "apertus" and m not in WITH_MIXERS | WITH_BLOCK_SCALES)


def _tol(model_type: str) -> float:
    """Float64 agreement; HF's Gemma RMSNorms compute ``n(x) * (1 + w)`` in float32 even in a
    float64 model, so both sides carry float32 rounding there."""
    return 2e-5 if model_type.startswith("gemma") else 1e-9


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_fractional_alpha_matches_mixed_weights_per_token(model_type):
    base, donor = tiny_models(model_type, 2, torch.float64)
    ids = random_ids(2, 6)
    n_slots = len(wg.slots(base))
    alpha = torch.rand(2, 6, n_slots, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = PartialGraft(base, donor).forward(ids, alpha)
    ref = per_token_mixed_forward([base, donor], ids, alpha)
    assert (got - ref).abs().max().item() < _tol(model_type)
    # the mixture is neither model: the comparison means something
    assert (ref - base(ids).logits).abs().max().item() > 1e-2
    assert (ref - donor(ids).logits).abs().max().item() > 1e-2


@pytest.mark.parametrize("model_type", ["gpt2", "gemma3_text", "llama", "phi3"])
@torch.no_grad()
def test_padding_and_logit_positions(model_type):
    base, donor = tiny_models(model_type, 2, torch.float64)
    ids = random_ids(2, 7, seed=1)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding on row 0
    n_slots = len(wg.slots(base))
    alpha = torch.rand(2, 7, n_slots, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    pos = torch.tensor([[6, 4], [3, 6]])
    got = PartialGraft(base, donor).forward(ids, alpha, mask, logit_positions=pos)
    ref = per_token_mixed_forward([base, donor], ids, alpha, mask)
    assert (got - ref.gather(1, pos[..., None].expand(-1, -1, ref.shape[-1]))).abs().max().item() < _tol(model_type)


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_integer_alpha_is_the_integer_graft(model_type):
    base, donor = tiny_models(model_type, 2, torch.float32)
    ids = random_ids(2, 6, seed=2)
    n_slots = len(wg.slots(base))
    source = torch.randint(0, 2, (2, 6, n_slots), generator=torch.Generator().manual_seed(5))
    got = PartialGraft(base, donor).forward(ids, source.float())
    assert (got - wg.graft_forward([base, donor], ids, source)).abs().max().item() < 1e-4


@pytest.mark.parametrize("model_type", ["gpt2", "gemma", "qwen2"])
@torch.no_grad()
def test_swapped_pair_moves_towards_the_old_base(model_type):
    base, donor = tiny_models(model_type, 2, torch.float64)
    ids = random_ids(1, 5)
    n_slots = len(wg.slots(base))
    alpha = torch.rand(1, 5, n_slots, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    pair = PartialGraft(base, donor)
    got = pair.swapped().forward(ids, alpha)
    assert (got - per_token_mixed_forward([donor, base], ids, alpha)).abs().max().item() < _tol(model_type)


def test_bad_alpha_is_refused():
    base, donor = tiny_models("llama", 2, torch.float64)
    with pytest.raises(ValueError, match="alpha must have shape"):
        PartialGraft(base, donor).forward(random_ids(1, 4), torch.zeros(1, 4, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="float tensor"):
        PartialGraft(base, donor).forward(random_ids(1, 4), torch.zeros(1, 4, len(wg.slots(base)), dtype=torch.long))


def test_non_affine_activation_is_refused_in_one_line():
    """A fractional graft of xIELU's alpha is no mix of two outputs: refused on the model, and
    before loading (localize's plan reads the meta model), never computed another way."""
    from weightgraft.engine.partial import refuse_non_affine
    from weightgraft.errors import GraftArgumentTypeError

    base, donor = tiny_models("apertus", 2)
    with pytest.raises(GraftArgumentTypeError, match=r"layers\.0\.act \(model\.layers\.0\.mlp\.act_fn\) is a XIELUActivation"):
        PartialGraft(base, donor)
    with torch.device("meta"):
        meta = type(base)(base.config)
    with pytest.raises(GraftArgumentTypeError, match="need every slot's module affine"):
        refuse_non_affine(meta)
    refuse_non_affine(tiny_models("llama", 1)[0])  # the null: an affine model passes
    gemma4, gemma4_donor = tiny_models("gemma4_text", 2)  # Gemma 4's block output scale: named, not mixed some other way
    with pytest.raises(GraftArgumentTypeError, match=r"do not mix a block's output scale \(layers\.0\.layer_scalar"):
        PartialGraft(gemma4, gemma4_donor)
