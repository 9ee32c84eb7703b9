"""float64 that is float64: inside ``float64_exact`` HF's float32 casts (norms, rotary, eager
softmax) keep float64, so the engine and the per-token definition agree to float64 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import TINY_CONFIGS, make_donor, make_tiny
from transformers import DynamicCache

import weightgraft as wg
from weightgraft.engine.check import check_engine
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward

IDS = torch.tensor([[5, 9, 14, 22, 31, 40, 47, 53, 60]])


def _layer0_residuals(base: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input of layer 0's MLP norm (the residual after attention), from a whole-sequence
    pass and from a position-by-position KV-cache pass of the same model."""
    seen: list[torch.Tensor] = []
    hook = base.model.layers[0].post_attention_layernorm.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0][0].clone()))
    base(ids)
    cache = DynamicCache(config=base.config)
    for t in range(ids.shape[1]):
        base(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
    hook.remove()
    return seen[0], torch.cat(seen[1:])


def _crafted_llama() -> tuple[list[torch.nn.Module], torch.Tensor]:
    """The tiny llama with one embedding value moved (below its float32 resolution) so that a
    layer-0 residual lies on a float32 rounding midpoint between its batched and its
    position-by-position value: HF's float32 RMSNorm then rounds the two passes apart."""
    base = make_tiny("llama", seed=0).double()
    full, step = _layer0_residuals(base, IDS)
    p, d = (int(i) for i in (full != step).nonzero()[-1])
    a, b = full[p, d].item(), step[p, d].item()
    low = np.float32(a)
    high = np.nextafter(low, np.float32(np.inf) if a > low else np.float32(-np.inf))
    delta = (float(low) + float(high)) / 2 - (a + b) / 2
    assert abs(delta) < 1e-8  # below the embedding's float32 resolution
    base.get_input_embeddings().weight[int(IDS[0, p]), d] += delta
    return [base, make_donor(base, 1)], torch.zeros(0)


def _source(models: list[torch.nn.Module]) -> torch.Tensor:
    names = wg.slots(models[0])
    src = torch.randint(0, 2, (1, IDS.shape[1], len(names)), generator=torch.Generator().manual_seed(0))
    layer0 = [i for i, s in enumerate(names) if s == "embed" or s.startswith("layers.0.")]
    src[..., layer0] = 0  # layer 0 from the base: its residuals are the ones crafted above
    return src


@torch.no_grad()
def test_crafted_float32_midpoint_is_exact_in_float64_mode():
    models, _ = _crafted_llama()
    src = _source(models)
    plain = (wg.graft_forward(models, IDS, src) - per_token_forward(models, IDS, src)).abs().max().item()
    # HF's float32 cast makes the crafted case differ far above float64 rounding ...
    assert plain > 1e-9
    with float64_exact(models):
        exact = (wg.graft_forward(models, IDS, src) - per_token_forward(models, IDS, src)).abs().max().item()
    # ... and in float64 throughout, the engine equals the definition to rounding
    assert exact <= 1e-12
    report = check_engine(models, IDS, torch.ones_like(IDS), n_random=2)
    assert report.passed and report.max_abs_diff <= 1e-12


@torch.no_grad()
def test_float64_mode_computes_norm_rotary_and_softmax_in_float64():
    base = make_tiny("gemma2", seed=0).double()
    base.config._attn_implementation = "eager"  # Gemma 2's eager softmax casts to float32
    ids = IDS[:, :6]
    seen: dict[str, object] = {}
    real_softmax = torch.nn.functional.softmax

    def spy(*args, **kwargs):
        out = real_softmax(*args, **kwargs)
        seen["softmax"] = out.dtype
        return out

    norm_cls = type(base.model.layers[0].input_layernorm)
    orig_norm = norm_cls._norm
    hook = base.model.rotary_emb.register_forward_hook(lambda _m, _a, out: seen.__setitem__("cos", out[0][0]))
    # cos of the rotary angles computed in float64 from the model's own frequencies
    angles = torch.arange(ids.shape[1], dtype=torch.float64)[:, None] * base.model.rotary_emb.inv_freq.double()
    cos64 = torch.cat([angles, angles], -1).cos()
    try:
        torch.nn.functional.softmax = spy
        norm_cls._norm = lambda self, x: (seen.__setitem__("norm", x.dtype), orig_norm(self, x))[1]
        base(ids)
        assert (seen["norm"], seen["softmax"]) == (torch.float32, torch.float32)
        assert (seen["cos"] - cos64).abs().max().item() > 1e-10  # HF's rotary: float32
        with float64_exact([base]):
            exact = base(ids).logits
        assert (seen["norm"], seen["softmax"]) == (torch.float64, torch.float64)
        assert (seen["cos"] - cos64).abs().max().item() <= 1e-15
        seen.clear()
        again = base(ids).logits  # restored on exit: the float32 casts again
        assert seen["norm"] == torch.float32 and not torch.equal(again, exact)
    finally:
        torch.nn.functional.softmax = real_softmax
        norm_cls._norm = orig_norm
        hook.remove()


def test_float64_mode_leaves_other_dtypes_alone():
    base = make_tiny("llama", seed=0)
    ids = IDS[:, :5]
    with torch.no_grad():
        plain = base(ids).logits
        with float64_exact([base]):
            inside = base(ids).logits
    assert inside.dtype == torch.float32 and torch.equal(inside, plain)


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
@torch.no_grad()
def test_float64_engine_and_check_at_rounding_on_every_architecture(model_type):
    """In float64 rounding is ~1e-15, so agreement to 1e-12 leaves no room for a real error."""
    base = make_tiny(model_type, seed=0).double()
    models = [base, make_donor(base, 1), make_donor(base, 2)]
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding on one row (Gemma 2 included: HF's float32 softmax gave NaN)
    source = torch.randint(0, 3, (2, 9, len(wg.slots(base))), generator=torch.Generator().manual_seed(2))
    with float64_exact(models):
        fast = wg.graft_forward(models, ids, source, attention_mask=mask)
        ref = per_token_forward(models, ids, source, attention_mask=mask)
        # the engine equals HF's own full forward pass exactly when one model serves everything
        assert torch.equal(wg.graft_forward(models, ids, torch.zeros_like(source)), base(ids).logits)
    real = mask.bool()
    assert (fast[real] - ref[real]).abs().max().item() <= 1e-12
    report = check_engine(models, ids, mask, n_random=2)  # check runs in float64_exact itself
    assert report.passed, [(c.name, c.max_abs_diff) for c in report.cases]
    assert report.max_abs_diff <= 1e-12
