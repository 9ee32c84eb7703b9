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

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from weightgraft.engine import lora, projections
from weightgraft.engine.architectures import Slot, UnitKind, model_slots
from weightgraft.engine.compat import check_compatible
from weightgraft.engine.forward import position_ids_from_mask
from weightgraft.engine.swaps import Swaps, own_forward, swaps
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["PartialGraft", "partial_graft_forward"]


def _embedding_weight(model: nn.Module) -> torch.Tensor:
    # nn.Module's stubs type a model's methods and a module's weight as ``Tensor | Module`` attributes
    return cast(torch.Tensor, cast("PreTrainedModel", model).get_input_embeddings().weight)


def _is_affine(module: nn.Module) -> bool:
    """Modules whose output is affine in their own parameters at a fixed input."""
    if projections.is_projection(module) or isinstance(module, (nn.Embedding, nn.LayerNorm)):
        return True
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm"))


def refuse_non_affine(model: nn.Module) -> None:
    """One line for a model with a slot whose module is not affine in its weights (Apertus' xIELU
    activation, ``act``; a hybrid's recurrent mixer): a fractional graft's output there is no mix of the two modules' outputs,
    so partial grafts (fractional weights per cell, attribution, localize's estimates) are refused
    rather than computed some other way. Reads module types only (a meta-device model serves)."""
    for slot in model_slots(model):
        if slot.mixer is not None:  # a conv kernel over earlier positions, decay parameters inside exp / softplus
            raise GraftArgumentTypeError(
                f"partial grafts (fractional weights per cell, attribution, localize) are refused on a recurrent token "
                f"mixer ({slot.name}): its decay parameters enter through exp / softplus and its kernel reads earlier "
                "positions, so a fractional weight is no mix of two outputs. Whole grafts (wg.graft, run) are exact")
        if slot.scalar:  # affine in the scalar, but applied inside the block's own forward, which no plan here mixes
            raise GraftArgumentTypeError(
                f"partial grafts (fractional weights per cell, attribution, localize) do not mix a block's output scale "
                f"({slot.name}, applied by the block itself, not by a module). Whole grafts (wg.graft, run) are exact; "
                "localize runs with estimates: false")
        for part in slot.parts:
            module = model.get_submodule(part.path)
            if not _is_affine(module):
                raise GraftArgumentTypeError(
                    f"partial grafts (fractional weights per cell, attribution, localize) need every slot's module "
                    f"affine in its weights; {slot.name} ({part.path}) is a {type(module).__name__}, whose output is "
                    "not a mix of the two models' outputs. Whole grafts (wg.graft, run) are exact on this model"
                )


@dataclass
class _ModulePlan:
    """One grafted module: its slots (with their output columns) and how to compute ``D``."""

    path: str
    pos_axis: int
    slots: list[int]  # slot indices that own (part of) this module
    onehot: torch.Tensor | None  # [len(slots), out]: which output columns each slot owns
    delta: Callable[..., torch.Tensor]  # ``D(x, *args, **kwargs)``: the module's own arguments
    # projections only: ``x -> x ΔW`` without the bias, and the bias difference (unit grafts)
    weight_delta: Callable[[torch.Tensor], torch.Tensor] | None = None
    bias_delta: torch.Tensor | None = None


def _linear_delta(
    module: nn.Module, donor: nn.Module, dtype: torch.dtype,
) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    """``D``, its weight part ``x -> x ΔW`` and the bias difference ``Δb`` (or None)."""
    # effective weights: a LoRA layer's ``.weight`` is its base projection's alone
    dw = projections.effective_weight(donor, dtype) - projections.effective_weight(module, dtype)
    db = None
    if module.bias is not None:  # nn.Module's stubs type a module's bias as ``Tensor | Module``
        db = cast(torch.Tensor, donor.bias).detach().to(dtype) - cast(torch.Tensor, module.bias).detach().to(dtype)
    return (lambda x, *a, **k: projections.apply_weight(module, x.to(dtype), dw, db),
            lambda x: projections.apply_weight(module, x.to(dtype), dw, None), db)


def _adapter_delta(module: nn.Module, donor: nn.Module, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """Two layers around one projection (a LoRA donor and its base): ``D(x)`` is the
    difference of their adapters' outputs, low rank, never a full ``[out, in]`` delta (the
    modules a LoRA donor does not adapt cost nothing)."""
    width = projections.out_features(module)

    def delta(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        x = x.to(dtype)
        d, m = lora.adapter_output(donor, x, dtype=dtype), lora.adapter_output(module, x, dtype=dtype)
        if d is None:
            return x.new_zeros(*x.shape[:-1], width) if m is None else -m
        return d - m if m is not None else d

    return delta


def _general_delta(module: nn.Module, donor: nn.Module, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
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

    def delta(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        x = x if is_embedding else x.to(dtype)
        out: torch.Tensor = with_delta(x, *args, **kwargs) - zero(x, *args, **kwargs)
        return out

    return delta


class _AtZero(torch.autograd.Function):
    """``y`` unchanged, with ``d(out)/d(coef) = <grad, D(x)>`` computed in the backward only.

    Exact at ``a = 0``: there ``a * D(x)`` adds nothing and ``d(a * D(x))/dx = a * dD/dx = 0``,
    so ``D`` is needed only for the gradient w.r.t. ``a``; it is computed once, in the backward
    (the attribution-patching trick), instead of in the forward and again through autograd."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, coef: torch.Tensor, x: torch.Tensor, plan: _ModulePlan,
                sign: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.plan, ctx.sign, ctx.coef_shape = plan, sign, coef.shape
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None, None]:
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
        refuse_non_affine(base)
        self.base, self.donor, self.sign = base, donor, sign
        self.slots: list[Slot] = model_slots(base)
        self.plans = _plans if _plans is not None else self._build_plans()

    def _build_plans(self) -> list[_ModulePlan]:
        weight = _embedding_weight(self.base)
        dtype = torch.promote_types(weight.dtype, torch.float32)
        by_path: dict[str, list[tuple[int, torch.Tensor | None, int]]] = {}
        for s, slot in enumerate(self.slots):
            for part in slot.parts:
                by_path.setdefault(part.path, []).append((s, part.columns, part.pos_axis))
        plans = []
        for path, owners in by_path.items():
            module, donor = self.base.get_submodule(path), self.donor.get_submodule(path)
            onehot = None
            if len(owners) > 1 and any(cols is None for _, cols, _ in owners):
                raise GraftArgumentTypeError(f"{path} is owned whole by several slots; cannot mix it per slot")
            if any(cols is not None for _, cols, _ in owners):
                onehot = torch.zeros(len(owners), projections.out_features(module), dtype=dtype, device=weight.device)
                for i, (_, cols, _) in enumerate(owners):
                    onehot[i, cols if cols is not None else slice(None)] = 1.0
            weight_delta, bias_delta = None, None
            if projections.is_projection(module) and lora.same_projection(module, donor):
                delta = weight_delta = _adapter_delta(module, donor, dtype)  # LoRA: no bias change
            elif projections.is_projection(module):
                delta, weight_delta, bias_delta = _linear_delta(module, donor, dtype)
            else:
                delta = _general_delta(module, donor, dtype)
            plans.append(_ModulePlan(path, owners[0][2], [s for s, _, _ in owners], onehot, delta,
                                     weight_delta, bias_delta))
        return plans

    def swapped(self) -> PartialGraft:
        """The donor as base and the base as donor (``a`` now moves towards the old base)."""
        return PartialGraft(self.donor, self.base, self.plans, -self.sign)

    def forward(
        self, input_ids: torch.Tensor, alpha: torch.Tensor, attention_mask: torch.Tensor | None = None,
        logit_positions: torch.Tensor | None = None, first_order: bool = True,
        unit_alpha: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` (or ``[batch, k, vocab]`` at ``logit_positions``) with
        cell ``(b, t, s)`` served by ``(1 - alpha[b, t, s]) * base + alpha[b, t, s] * donor``.
        Differentiable in ``alpha``; run it under ``torch.enable_grad()`` for gradients.
        ``first_order``: when every ``alpha`` is 0, compute ``D`` in the backward only (the same
        values and first derivatives w.r.t. ``alpha``; not for second derivatives).

        ``unit_alpha`` (slot name -> ``[batch, seq, units]``) mixes a q/k/v/o slot head by head
        or a gate/up/down slot neuron by neuron, each unit's columns (as ``graft_forward``'s
        ``head_source`` / ``neuron_source`` define them) with its own share; ``alpha`` of such a
        slot then mixes only what belongs to no unit: o's and down's bias (nothing for
        q/k/v/gate/up, whose bias entries belong to their units). All units at 1 and ``alpha``
        at 1 is the whole slot grafted."""
        batch, seq = input_ids.shape
        expected = (batch, seq, len(self.slots))
        if tuple(alpha.shape) != expected:
            raise GraftArgumentError(f"alpha must have shape [batch, seq, n_slots] = {list(expected)}, "
                             f"got {list(alpha.shape)}")
        if not alpha.dtype.is_floating_point:
            raise GraftArgumentTypeError(f"alpha must be a float tensor, got {alpha.dtype}")
        device = _embedding_weight(self.base).device
        input_ids, alpha = input_ids.to(device), alpha.to(device)
        if attention_mask is None:
            attention_mask = torch.ones(batch, seq, dtype=torch.long, device=device)
        attention_mask = attention_mask.to(device)
        unembed_alpha = alpha[..., -1]  # "unembed" is always the last slot
        units = self._check_units(unit_alpha or {}, batch, seq, device)
        with swaps() as swap:
            if logit_positions is not None:  # "unembed" is always the last slot
                logit_positions = swap.logit_rows(self.base.get_submodule(self.slots[-1].parts[0].path),
                                                  logit_positions.to(device), (batch, seq))
                unembed_alpha = unembed_alpha.gather(1, logit_positions)
            at_zero = first_order and not bool(alpha.detach().any()) and not any(
                bool(u.detach().any()) for u in units.values())
            self._swap_forwards(swap, alpha, unembed_alpha, at_zero, units)
            swap.eval_mode([self.base])
            swap.eager_attention([self.base])
            out = self.base(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        logits: torch.Tensor = out.logits
        return logits

    __call__ = forward

    def _check_units(self, unit_alpha: Mapping[str, torch.Tensor], batch: int, seq: int,
                     device: torch.device) -> dict[int, torch.Tensor]:
        """``unit_alpha`` by slot index, checked: unit slots only, ``[batch, seq, units]``, float."""
        index = {slot.name: s for s, slot in enumerate(self.slots)}
        out = {}
        for name, tensor in unit_alpha.items():
            if name not in index:
                raise GraftArgumentError(f"unit_alpha names {name!r}, which is not a slot of this model")
            slot = self.slots[index[name]]
            kind = slot.unit_kind()
            if kind is None:
                raise GraftArgumentError(f"slot {name!r} has no units; only q, k, v, o (heads) and gate, up, down "
                                 "(neurons) can be mixed unit by unit")
            if tuple(tensor.shape) != (batch, seq, slot.units(kind)):
                raise GraftArgumentError(f"unit_alpha[{name!r}] must have shape [batch, seq, {kind}s] = "
                                 f"{[batch, seq, slot.units(kind)]}, got {list(tensor.shape)}")
            if not tensor.dtype.is_floating_point:
                raise GraftArgumentTypeError(f"unit_alpha[{name!r}] must be a float tensor, got {tensor.dtype}")
            out[index[name]] = tensor.to(device)
        return out

    def _unit_kind(self, s: int) -> UnitKind:
        kind = self.slots[s].unit_kind()
        assert kind is not None  # _check_units took unit shares of unit slots only
        return kind

    def _unit_layout(self, plan: _ModulePlan, units: dict[int, torch.Tensor]) -> tuple[str, torch.Tensor, list[int]]:
        """For a module some of whose slots are mixed unit by unit: the side units sit on, the
        index of each column (output side: of the module's output; input side: of its input)
        into the concatenated unit shares of those slots (their total where a column is in no
        unit), and those slots in order."""
        module = self.base.get_submodule(plan.path)
        split = [s for s in plan.slots if s in units]
        sides = {self.slots[s].unit_side(self._unit_kind(s)) for s in split}
        if len(sides) != 1:
            raise TypeError(f"{plan.path}: units on both sides of one module")
        side = sides.pop()
        assert side is not None  # a unit slot's units are output or input columns
        width = projections.in_features(module) if side == "in" else projections.out_features(module)
        total = sum(self.slots[s].units(self._unit_kind(s)) for s in split)
        index = torch.full((width,), total, dtype=torch.long)
        offset = 0
        for s in split:
            cols = torch.stack(self.slots[s].unit_columns(module, self._unit_kind(s)))  # [units, w]
            index[cols.reshape(-1)] = torch.arange(offset, offset + cols.shape[0]).repeat_interleave(cols.shape[1])
            offset += cols.shape[0]
        return side, index, split

    def _swap_forwards(self, swap: Swaps, alpha: torch.Tensor, unembed_alpha: torch.Tensor, at_zero: bool,
                       units: dict[int, torch.Tensor]) -> None:
        """Every module some slot owns computes ``base(x)`` plus its cells' shares of ``D(x)``."""
        unembed = len(self.slots) - 1
        for plan in self.plans:
            module = self.base.get_submodule(plan.path)
            coef = unembed_alpha[..., None] if plan.slots == [unembed] else alpha[..., plan.slots]
            if any(s in units for s in plan.slots):
                swap.forward(module, self._unit_forward(module, plan, coef, units, at_zero))
            else:
                swap.forward(module, self._mixed_forward(module, plan, coef, at_zero))

    def _mixed_forward(self, module: nn.Module, plan: _ModulePlan, coef: torch.Tensor,
                       at_zero: bool) -> Callable[..., torch.Tensor]:
        """``base(x) + a * D(x)``; ``coef`` is ``[batch, seq, len(plan.slots)]``."""
        fn = own_forward(module)
        sign = self.sign

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            y: torch.Tensor = fn(x, *args, **kwargs)
            if at_zero:
                apply = cast(Callable[..., torch.Tensor], _AtZero.apply)  # torch leaves Function.apply unannotated
                return apply(y, coef, x, plan, sign) if coef.requires_grad else y
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


    def _unit_forward(self, module: nn.Module, plan: _ModulePlan, coef: torch.Tensor,
                      units: dict[int, torch.Tensor], at_zero: bool) -> Callable[..., torch.Tensor]:
        """``base(x)`` plus each unit's share of ``D``: output side (q/k/v, gate/up), column
        ``c`` gets ``a[unit(c)] * D(x)_c`` (slots of the module not split keep their own share);
        input side (o, down), ``(x * a[unit(column)]) ΔW`` plus the slot's share of ``Δb``."""
        fn = own_forward(module)
        sign = self.sign
        side, index, split = self._unit_layout(plan, units)
        ucoef = torch.cat([units[s] for s in split], dim=-1)  # [batch, seq, U]
        keep = torch.tensor([s not in units for s in plan.slots], dtype=coef.dtype, device=coef.device)
        index = index.to(coef.device)
        layout = _UnitLayout(side, index, int(ucoef.shape[-1]), keep)

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            y: torch.Tensor = fn(x, *args, **kwargs)
            if at_zero:
                if coef.requires_grad or ucoef.requires_grad:
                    apply = cast(Callable[..., torch.Tensor], _UnitsAtZero.apply)  # torch leaves it unannotated
                    return apply(y, coef, ucoef, x, plan, layout, sign)
                return y
            padded = torch.cat([ucoef, ucoef.new_zeros(*ucoef.shape[:-1], 1)], dim=-1)
            if side == "out":
                d = plan.delta(x)
                c = padded[..., index].to(d.dtype)
                if plan.onehot is not None:  # fused: the module's other slots keep their share
                    c = c + (coef * keep).to(d.dtype) @ plan.onehot.to(device=d.device)
                return y + (sign * c * d).to(y.dtype)
            scaled = x * padded[..., index].to(x.dtype)
            assert plan.weight_delta is not None  # input-side units are a projection's
            d = plan.weight_delta(scaled)
            if plan.bias_delta is not None:
                d = d + coef[..., :1].to(d.dtype) * plan.bias_delta
            return y + (sign * d).to(y.dtype)

        return forward


@dataclass(frozen=True)
class _UnitLayout:
    side: str  # "out" | "in"
    index: torch.Tensor  # per column, its unit (``n_units`` for a column in no unit)
    n_units: int
    keep: torch.Tensor  # per slot of the module: 1 where it is not split (its share still counts)


class _UnitsAtZero(torch.autograd.Function):
    """``y`` unchanged at ``a = 0``, with the gradients w.r.t. the slot shares and the unit
    shares computed in the backward only (as ``_AtZero``, per unit)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, coef: torch.Tensor, ucoef: torch.Tensor, x: torch.Tensor,
                plan: _ModulePlan, layout: _UnitLayout, sign: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.plan, ctx.layout, ctx.sign = plan, layout, sign
        ctx.shapes = (coef.shape, ucoef.shape)
        return y.clone()

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None, None]:
        (x,) = ctx.saved_tensors
        plan, layout = ctx.plan, ctx.layout
        coef_shape, ucoef_shape = ctx.shapes
        with torch.no_grad():
            if layout.side == "out":
                d = plan.delta(x) * ctx.sign
                per_column = grad.to(d.dtype) * d
                g = (per_column @ plan.onehot.to(device=d.device).T if plan.onehot is not None
                     else per_column.sum(-1, keepdim=True))
                g = g * layout.keep.to(device=g.device, dtype=g.dtype)  # a split slot's share moves nothing here
            else:
                with torch.enable_grad():
                    xs = x.detach().requires_grad_(True)
                    out = plan.weight_delta(xs)
                    (g_in,) = torch.autograd.grad(out, xs, grad.to(out.dtype) * ctx.sign)
                per_column = x.to(g_in.dtype) * g_in
                g = torch.zeros(*grad.shape[:-1], 1, dtype=per_column.dtype, device=grad.device)
                if plan.bias_delta is not None:
                    g = (grad.to(plan.bias_delta.dtype) * plan.bias_delta * ctx.sign).sum(-1, keepdim=True)
            index = layout.index.to(per_column.device)
            gu = per_column.new_zeros(*per_column.shape[:-1], layout.n_units + 1)
            gu.index_add_(-1, index, per_column)
        return grad, g.reshape(coef_shape), gu[..., :-1].reshape(ucoef_shape), None, None, None, None


def partial_graft_forward(
    base: nn.Module, donor: nn.Module, input_ids: torch.Tensor, alpha: torch.Tensor,
    attention_mask: torch.Tensor | None = None, logit_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """One-off ``PartialGraft(base, donor).forward(...)`` (build a ``PartialGraft`` to reuse
    its deltas across calls)."""
    return PartialGraft(base, donor).forward(input_ids, alpha, attention_mask, logit_positions)
