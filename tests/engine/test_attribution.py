"""Graft attribution against finite differences of the exact partial-graft function."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_CONFIGS, WITH_BLOCK_SCALES, WITH_MIXERS, tiny_models

from weightgraft.engine.attribution import donor_logprobs, graft_attribution, graft_metric
from weightgraft.engine.partial import PartialGraft

# Apertus' xIELU activation is not affine in its weights: partial grafts refuse it
# (test_non_affine_activation_is_refused_in_one_line in test_partial.py)
# Apertus (xIELU) and the hybrids (a recurrent mixer) refuse partial grafts, so attribution too
ARCHS = sorted(m for m in TINY_CONFIGS if m != "apertus" and m not in WITH_MIXERS | WITH_BLOCK_SCALES)
# Architectures whose HF modules compute in the model's dtype throughout (LayerNorm); the
# RMSNorms of the others normalize in float32 even in a float64 model.
FLOAT64_CLEAN = {"gpt2", "gpt_neox", "stablelm"}


def _batch(seq: int = 6):
    ids = torch.randint(3, 64, (2, seq), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, -1] = 0  # row 1 is one token shorter (right padding)
    return ids, mask, torch.tensor([seq - 1, seq - 2]), torch.tensor([5, 9])


# every architecture under one metric, the metrics taken in turn (each on a third of them, float64-clean
# LayerNorm families and float32-normed ones alike): the metric's gradient does not depend on the architecture
METRICS = ("first_logprob", "logit_diff", "neg_kl_donor")


@pytest.mark.parametrize(("model_type", "metric"), [(a, METRICS[i % len(METRICS)]) for i, a in enumerate(ARCHS)])
def test_gradient_matches_finite_difference(model_type, metric):
    pair = PartialGraft(*tiny_models(model_type, 2, torch.float64))
    ids, mask, pos, targets = _batch()
    n_slots = len(pair.slots)
    gen = torch.Generator().manual_seed(1)
    alpha = torch.rand(2, ids.shape[1], n_slots, generator=gen, dtype=torch.float64)
    distractors = torch.tensor([7, 11]) if metric == "logit_diff" else None
    ref = donor_logprobs(pair, ids, pos, mask) if metric == "neg_kl_donor" else None
    grad = graft_attribution(pair, ids, pos, targets=targets, metric=metric, distractors=distractors, attention_mask=mask, start=alpha)
    for s in range(n_slots):  # every slot, at a random position up to row 0's scored one
        t = int(pos[0]) if pair.slots[s].name in ("final_norm", "unembed") else int(torch.randint(0, int(pos[0]) + 1, (1,), generator=gen))

        def central(h: float, t: int = t, s: int = s) -> float:
            bumped = []
            for sign in (1, -1):
                a = alpha.clone()
                a[0, t, s] += sign * h
                with torch.no_grad():
                    bumped.append(float(graft_metric(pair, ids, a, positions=pos, targets=targets, metric=metric, distractors=distractors, attention_mask=mask, reference_logprobs=ref)[0]))
            return (bumped[0] - bumped[1]) / (2 * h)

        got = float(grad[0, t, s])
        if model_type in FLOAT64_CLEAN:
            fd, tol = central(1e-5), 1e-7 + 1e-6 * abs(got)
        else:  # float32 rounding inside the norms: larger steps, Richardson-extrapolated
            fd, tol = (4 * central(5e-3) - central(1e-2)) / 3, 3e-4 + 3e-3 * abs(got)
        assert abs(got - fd) <= tol, (pair.slots[s].name, got, fd)

@pytest.mark.parametrize("metric", ["logprob", "logit_diff"])
def test_gradient_is_exact_with_float64_rmsnorm(monkeypatch, metric):
    """With Llama's RMSNorm computed in float64, the finite difference is sharp and every cell's
    gradient agrees to ~1e-6 relative: the looser check above is float32 rounding, not error."""
    import transformers.models.llama.modeling_llama as llama

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", forward)
    pair = PartialGraft(*tiny_models("llama", 2, torch.float64))
    ids, mask, pos, targets = _batch()
    alpha = torch.rand(2, ids.shape[1], len(pair.slots), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    distractors = torch.tensor([7, 11])
    grad = graft_attribution(pair, ids, pos, targets=targets, metric=metric, distractors=distractors, attention_mask=mask, start=alpha)
    for s in range(len(pair.slots)):
        for t in range(int(pos[0]) + 1):
            vals = []
            for sign in (1, -1):
                a = alpha.clone()
                a[0, t, s] += sign * 1e-5
                with torch.no_grad():
                    vals.append(float(graft_metric(pair, ids, a, positions=pos, targets=targets, metric=metric, distractors=distractors, attention_mask=mask)[0]))
            fd = (vals[0] - vals[1]) / 2e-5
            assert abs(float(grad[0, t, s]) - fd) <= 1e-8 + 1e-6 * abs(fd)


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen3"])
def test_cells_that_cannot_matter_get_zero(model_type):
    pair = PartialGraft(*tiny_models(model_type, 2, torch.float64))
    ids, mask, pos, targets = _batch()
    grad = graft_attribution(pair, ids, pos, targets=targets, attention_mask=mask)
    names = [s.name for s in pair.slots]
    out_only = [names.index("unembed")] + ([names.index("final_norm")] if "final_norm" in names else [])
    assert grad[1, int(pos[1]) + 1:].abs().max() == 0  # after the scored position
    for b in range(2):
        others = [t for t in range(ids.shape[1]) if t != int(pos[b])]
        assert grad[b, others][:, out_only].abs().max() == 0
        assert grad[b, int(pos[b]), out_only].abs().min() > 0
    assert grad[0, :, names.index("layers.0.q")].abs().sum() > 0


@pytest.mark.parametrize("model_type", ["gpt2", "gemma2", "phi3"])
def test_integrated_gradients_add_up_to_the_total_change(model_type):
    pair = PartialGraft(*tiny_models(model_type, 2, torch.float64))
    ids, mask, pos, targets = _batch(5)
    ig = graft_attribution(pair, ids, pos, targets=targets, attention_mask=mask, steps=24)
    n_slots = len(pair.slots)
    with torch.no_grad():
        m0 = graft_metric(pair, ids, torch.zeros(2, 5, n_slots, dtype=torch.float64), positions=pos, targets=targets, attention_mask=mask)
        m1 = graft_metric(pair, ids, torch.ones(2, 5, n_slots, dtype=torch.float64), positions=pos, targets=targets, attention_mask=mask)
    total = ig.sum(dim=(1, 2))
    assert torch.allclose(total, m1 - m0, rtol=2e-2, atol=2e-2)
    assert (m1 - m0).abs().min() > 0.1  # the pair differs: the check is not 0 == 0


def test_weights_keep_their_requires_grad():
    pair = PartialGraft(*tiny_models("llama", 2, torch.float64))
    ids, mask, pos, targets = _batch()
    before = [p.requires_grad for p in pair.base.parameters()]
    graft_attribution(pair, ids, pos, targets=targets, attention_mask=mask)
    assert [p.requires_grad for p in pair.base.parameters()] == before
    assert all(p.grad is None for p in pair.base.parameters())


@pytest.mark.parametrize("model_type", ARCHS)
def test_first_order_shortcut_at_zero_gives_the_same_gradient(model_type):
    pair = PartialGraft(*tiny_models(model_type, 2, torch.float64))
    ids, mask, pos, targets = _batch()
    grads = []
    for first_order in (True, False):
        alpha = torch.zeros(2, ids.shape[1], len(pair.slots), dtype=torch.float64, requires_grad=True)
        logits = pair.forward(ids, alpha, mask, pos[:, None], first_order=first_order)
        value = torch.log_softmax(logits[:, 0], -1)[torch.arange(2), targets].sum()
        grads.append(torch.autograd.grad(value, alpha)[0])
    assert grads[0].abs().max() > 1e-3
    assert torch.allclose(grads[0], grads[1], rtol=1e-9, atol=1e-10)
