"""Half precision: the engine against the per-token definition in the same dtype, within the
tolerance stated per dtype in ``weightgraft.engine.check.ORACLE_TOLERANCE``."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_CONFIGS, make_donor, make_tiny

import weightgraft as wg
from weightgraft.engine.check import ORACLE_TOLERANCE, check_engine
from weightgraft.engine.reference import per_token_forward


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
@torch.no_grad()
def test_half_precision_engine_matches_the_definition(model_type, dtype):
    base = make_tiny(model_type, seed=0)
    models = [m.to(dtype) for m in (base, make_donor(base, 1), make_donor(base, 2))]
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    source = torch.randint(0, 3, (2, 9, len(wg.slots(base))), generator=gen)
    fast = wg.graft_forward(models, ids, source)
    assert fast.dtype == (torch.float32 if model_type == "nemotron_h" else dtype)  # its head returns float32
    ref = per_token_forward(models, ids, source)
    atol, rtol = ORACLE_TOLERANCE[dtype]
    scale = ref.float().abs().max().item()
    assert (fast.float() - ref.float()).abs().max().item() <= atol + rtol * scale
    # and half precision stays close to float32 (what the tolerance is not hiding)
    ref32 = per_token_forward([m.float() for m in models], ids, source)
    if model_type == "qwen3_5" and dtype == torch.bfloat16 and (ref.float() - ref32).abs().max().item() > 0.1 * scale:
        pytest.xfail("the tiny Qwen3.5 vision-language wrapper's own bfloat16 definition departs from float32 by "
                     "~14% of the logit scale (measured 1.02 of 7.1); the engine equals that definition (above)")
    assert (ref.float() - ref32).abs().max().item() <= 0.1 * scale


def test_check_uses_the_dtype_tolerance():
    base = make_tiny("llama", seed=0)
    models = [m.to(torch.float16) for m in (base, make_donor(base, 1))]
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    report = check_engine(models, ids, torch.ones_like(ids))
    assert (report.atol, report.rtol) == ORACLE_TOLERANCE[torch.float16]
    assert report.passed
