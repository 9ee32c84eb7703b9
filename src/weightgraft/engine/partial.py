"""Partial grafts: a cell served by the mixed weights ``(1 - a) * W_base + a * W_donor``.

Every graftable module (Linear / GPT-2 Conv1D, RMSNorm incl. Gemma's ``(1 + w)``, LayerNorm,
embeddings) is affine in its own parameters at a fixed input, and the two shares sum to 1, so
the module with mixed weights gives ``f(x; W_base) + a * D(x)`` with
``D(x) = f(x; W_donor - W_base) - f(x; 0)``. One forward pass of the base model, each grafted
module adding ``a[b, t, slot] * D(x)`` (per output column group for fused q/k/v and gate/up),
is thus the per-token definition with mixed weights, and it is differentiable in ``a``: the
gradient w.r.t. ``a`` at every cell comes from one backward pass (``weightgraft.engine.attribution``).

The deltas are computed once per pair, in at least float32, from the weights (not as a
difference of two outputs, which would cancel most digits of a small finetuning change).
The integer ``graft_forward`` path is separate and untouched.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine import lora, projections
from weightgraft.engine.architectures import Slot, model_slots
from weightgraft.engine.compat import check_compatible
from weightgraft.engine.forward import (
    _eval_mode,
    _gather_rows,
    _module_fn,
    position_ids_from_mask,
)

__all__ = ["PartialGraft", "partial_graft_forward"]


def _is_affine(module: nn.Module) -> bool:
    """Modules whose output is affine in their own parameters at a fixed input."""
    if projections.is_projection(module) or isinstance(module, (nn.Embedding, nn.LayerNorm)):
        return True
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm"))


@dataclass
class _ModulePlan:
    """One grafted module: its slots (with their output columns) and how to compute ``D``."""

    path: str
    pos_axis: int
    slots: list[int]  # slot indices that own (part of) this module
    onehot: torch.Tensor | None  # [len(slots), out]: which output columns each slot owns
    delta: Callable[[torch.Tensor], torch.Tensor]


def _linear_delta(module: nn.Module, donor: nn.Module, dtype: torch.dtype) -> Callable:
    # effective weights: a LoRA layer's ``.weight`` is its base projection's alone
    dw = projections.effective_weight(donor, dtype) - projections.effective_weight(module, dtype)
    db = None
    if module.bias is not None:
        db = donor.bias.detach().to(dtype) - module.bias.detach().to(dtype)
    return lambda x, *a, **k: projections.apply_weight(module, x.to(dtype), dw, db)


def _adapter_delta(module: nn.Module, donor: nn.Module, dtype: torch.dtype) -> Callable:
    """Two layers around one projection (a LoRA donor and its base): ``D(x)`` is the
    difference of their adapters' outputs, low rank, never a full ``[out, in]`` delta (the
    modules a LoRA donor does not adapt cost nothing)."""
    width = projections.out_features(module)

    def delta(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        x = x.to(dtype)
        d, m = lora.adapter_output(donor, x, dtype=dtype), lora.adapter_output(module, x, dtype=dtype)
        if d is None and m is None:
            return x.new_zeros(*x.shape[:-1], width)
        return d - m if d is not None and m is not None else (d if d is not None else -m)

    return delta


def _general_delta(module: nn.Module, donor: nn.Module, dtype: torch.dtype) -> Callable:
    """``f(x; Δθ) - f(x; 0)``: exact for any module affine in its parameters (the constant part,
    e.g. Gemma's ``1 +``, cancels)."""
    with_delta = copy.deepcopy(module).to(dtype)
    zero = copy.deepcopy(module).to(dtype)
    for m in (with_delta, zero):
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
        m.__dict__.pop("forward", None)
    own = dict(donor.named_parameters())
    with torch.no_grad():
        for name, p in with_delta.named_parameters():
            p.copy_(own[name].detach().to(dtype) - p)
            p.requires_grad_(False)
        for p in zero.parameters():
            p.zero_()
            p.requires_grad_(False)
    is_embedding = isinstance(module, nn.Embedding)

    def delta(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        x = x if is_embedding else x.to(dtype)
        return with_delta(x, *args, **kwargs) - zero(x, *args, **kwargs)

    return delta


class _AtZero(torch.autograd.Function):
    """``y`` unchanged, with ``d(out)/d(coef) = <grad, D(x)>`` computed in the backward only.

    Exact at ``a = 0``: there ``a * D(x)`` adds nothing and ``d(a * D(x))/dx = a * dD/dx = 0``,
    so ``D`` is needed only for the gradient w.r.t. ``a``; it is computed once, in the backward
    (the attribution-patching trick), instead of in the forward and again through autograd."""

    @staticmethod
    def forward(ctx, y, coef, x, plan, sign):
        ctx.save_for_backward(x)
        ctx.plan, ctx.sign, ctx.coef_shape = plan, sign, coef.shape
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        plan = ctx.plan
        with torch.no_grad():
            d = plan.delta(x) * ctx.sign
            prod = grad.to(d.dtype) * d
            if plan.onehot is not None:  # [batch, seq, out] -> per slot of the module
                g = prod @ plan.onehot.to(device=d.device).T
            else:
                if plan.pos_axis != 1:
                    prod = prod.movedim(plan.pos_axis, 1)
                g = prod.sum(dim=tuple(range(2, prod.dim())))[..., None]
        return grad, g.reshape(ctx.coef_shape), None, None, None


class PartialGraft:
    """A base and a donor model, ready for forward passes with fractional grafts.

    ``sign=-1`` shares the deltas of a pair made the other way round: ``swapped()`` is the
    donor as base and the base as donor without a second copy of the deltas.
    """

    def __init__(self, base: nn.Module, donor: nn.Module, _plans: list[_ModulePlan] | None = None,
                 sign: float = 1.0) -> None:
        check_compatible([base, donor])
        self.base, self.donor, self.sign = base, donor, sign
        self.slots: list[Slot] = model_slots(base)
        self.plans = _plans if _plans is not None else self._build_plans()

    def _build_plans(self) -> list[_ModulePlan]:
        weight = self.base.get_input_embeddings().weight
        dtype = torch.promote_types(weight.dtype, torch.float32)
        by_path: dict[str, list[tuple[int, torch.Tensor | None, int]]] = {}
        for s, slot in enumerate(self.slots):
            for part in slot.parts:
                by_path.setdefault(part.path, []).append((s, part.columns, part.pos_axis))
        plans = []
        for path, owners in by_path.items():
            module, donor = self.base.get_submodule(path), self.donor.get_submodule(path)
            if not _is_affine(module):
                raise TypeError(f"partial grafts need modules affine in their weights; {path} "
                                f"is a {type(module).__name__}")
            onehot = None
            if len(owners) > 1 and any(cols is None for _, cols, _ in owners):
                raise TypeError(f"{path} is owned whole by several slots; cannot mix it per slot")
            if any(cols is not None for _, cols, _ in owners):
                onehot = torch.zeros(len(owners), projections.out_features(module), dtype=dtype, device=weight.device)
                for i, (_, cols, _) in enumerate(owners):
                    onehot[i, cols if cols is not None else slice(None)] = 1.0
            if projections.is_projection(module) and lora.same_projection(module, donor):
                delta = _adapter_delta(module, donor, dtype)
            elif projections.is_projection(module):
                delta = _linear_delta(module, donor, dtype)
            else:
                delta = _general_delta(module, donor, dtype)
            plans.append(_ModulePlan(path, owners[0][2], [s for s, _, _ in owners], onehot, delta))
        return plans

    def swapped(self) -> PartialGraft:
        """The donor as base and the base as donor (``a`` now moves towards the old base)."""
        return PartialGraft(self.donor, self.base, self.plans, -self.sign)

    def forward(
        self, input_ids: torch.Tensor, alpha: torch.Tensor, attention_mask: torch.Tensor | None = None,
        logit_positions: torch.Tensor | None = None, first_order: bool = True,
    ) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` (or ``[batch, k, vocab]`` at ``logit_positions``) with
        cell ``(b, t, s)`` served by ``(1 - alpha[b, t, s]) * base + alpha[b, t, s] * donor``.
        Differentiable in ``alpha``; run it under ``torch.enable_grad()`` for gradients.
        ``first_order``: when every ``alpha`` is 0, compute ``D`` in the backward only (the same
        values and first derivatives w.r.t. ``alpha``; not for second derivatives)."""
        batch, seq = input_ids.shape
        expected = (batch, seq, len(self.slots))
        if tuple(alpha.shape) != expected:
            raise ValueError(f"alpha must have shape [batch, seq, n_slots] = {list(expected)}, "
                             f"got {list(alpha.shape)}")
        if not alpha.dtype.is_floating_point:
            raise TypeError(f"alpha must be a float tensor, got {alpha.dtype}")
        device = self.base.get_input_embeddings().weight.device
        input_ids, alpha = input_ids.to(device), alpha.to(device)
        if attention_mask is None:
            attention_mask = torch.ones(batch, seq, dtype=torch.long, device=device)
        attention_mask = attention_mask.to(device)
        unembed_alpha = alpha[..., -1]  # "unembed" is always the last slot
        with contextlib.ExitStack() as stack:
            if logit_positions is not None:
                logit_positions = logit_positions.to(device=device, dtype=torch.long)
                if logit_positions.dim() != 2 or logit_positions.shape[0] != batch:
                    raise ValueError("logit_positions must be [batch, k] position indices")
                unembed_alpha = unembed_alpha.gather(1, logit_positions)
                head = self.base.get_submodule(self.slots[-1].parts[0].path)
                handle = head.register_forward_pre_hook(_gather_rows(logit_positions))
                stack.callback(handle.remove)
            at_zero = first_order and not bool(alpha.detach().any())
            stack.enter_context(self._patched(alpha, unembed_alpha, at_zero))
            stack.enter_context(_eval_mode([self.base]))
            out = self.base(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        return out.logits

    __call__ = forward

    @contextlib.contextmanager
    def _patched(self, alpha: torch.Tensor, unembed_alpha: torch.Tensor, at_zero: bool) -> Iterator[None]:
        unembed = len(self.slots) - 1
        patched: list[tuple[nn.Module, object]] = []
        try:
            for plan in self.plans:
                module = self.base.get_submodule(plan.path)
                coef = unembed_alpha[..., None] if plan.slots == [unembed] else alpha[..., plan.slots]
                patched.append((module, module.__dict__.get("forward")))
                module.forward = self._mixed_forward(module, plan, coef, at_zero)
            yield
        finally:
            for module, own in reversed(patched):
                if own is None:
                    del module.forward
                else:
                    module.forward = own

    def _mixed_forward(self, module: nn.Module, plan: _ModulePlan, coef: torch.Tensor, at_zero: bool) -> Callable:
        """``base(x) + a * D(x)``; ``coef`` is ``[batch, seq, len(plan.slots)]``."""
        fn = _module_fn(module, True)
        sign = self.sign

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            y = fn(x, *args, **kwargs)
            if at_zero:
                return _AtZero.apply(y, coef, x, plan, sign) if coef.requires_grad else y
            d = plan.delta(x, *args, **kwargs)
            c = coef.to(d.dtype)
            if plan.onehot is not None:  # column groups: [batch, seq, out]
                c = c @ plan.onehot.to(device=d.device)
            else:  # one slot owns the whole module: [batch, seq] onto (batch, pos_axis)
                shape = [c.shape[0]] + [1] * (d.dim() - 1)
                shape[plan.pos_axis] = c.shape[1]
                c = c[..., 0].reshape(shape)
            return y + (sign * c * d).to(y.dtype)

        return forward


def partial_graft_forward(
    base: nn.Module, donor: nn.Module, input_ids: torch.Tensor, alpha: torch.Tensor,
    attention_mask: torch.Tensor | None = None, logit_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """One-off ``PartialGraft(base, donor).forward(...)`` (build a ``PartialGraft`` to reuse
    its deltas across calls)."""
    return PartialGraft(base, donor).forward(input_ids, alpha, attention_mask, logit_positions)
