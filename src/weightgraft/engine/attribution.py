"""Graft attribution: the gradient of a metric w.r.t. the graft share ``a`` of every cell.

A cell is (position, slot). With a ``PartialGraft`` (base, donor) the metric is a smooth
function of ``alpha [batch, seq, n_slots]``; its gradient at ``alpha = 0`` is the first-order
estimate of the effect of grafting each single cell from the donor into the base (attribution
patching moved from activations to weights), for every cell at once, in one forward and one
backward pass. Integrated gradients (``steps > 1``) average the gradient at the midpoints of
``steps`` equal pieces of the straight path ``start -> end``, so the cells' shares add up to the
metric's total change along it (interactions included), at ``steps`` times the cost.

Directions: sufficiency is ``PartialGraft(pre, sft)`` at ``a = 0`` (SFT's cell into PRE);
necessity is ``PartialGraft(sft, pre)`` at ``a = 0`` (PRE's cell into SFT), i.e. the effect of
removing the finetuned cell. Both estimate ``M(graft one cell) - M(no graft)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from weightgraft.engine.architectures import UnitKind, Units
from weightgraft.engine.metric_table import Batch, localize_metric
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.projections import input_embedding_weight
from weightgraft.errors import GraftArgumentError

__all__ = ["Metric", "graft_attribution", "graft_unit_attribution", "graft_metric", "metric_values", "unit_slots"]

Metric = str  # a name of ``engine.metric_table.localize_metrics()`` (legacy ``logprob`` read as ``first_logprob``)


def metric_values(
    logits: torch.Tensor, targets: torch.Tensor, metric: Metric = "first_logprob",
    distractors: torch.Tensor | None = None, reference_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per row ``[batch]`` from logits ``[batch, vocab]`` at the scored positions: the metric's
    one implementation in ``engine.metric_table`` (where higher is always the donor's side)."""
    batch = localize_metric(metric).batch
    if batch is None:  # localize_metric returns entries with a batch form only
        raise RuntimeError(f"metric {metric!r} has no batch form")
    return batch(Batch(logits, targets, distractors, reference_logprobs))


@contextlib.contextmanager
def _frozen(models: list[nn.Module]) -> Iterator[None]:
    """No weight gradients for the call (the backward then only reaches ``a``)."""
    params = {id(p): p for m in models for p in m.parameters()}
    was = {k: p.requires_grad for k, p in params.items()}
    try:
        for p in params.values():
            p.requires_grad_(False)
        yield
    finally:
        for k, p in params.items():
            p.requires_grad_(was[k])


def _crop(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
          positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Positions after the last scored one cannot change any scored logit: leave them out."""
    stop = int(positions.max()) + 1
    mask = attention_mask[:, :stop] if attention_mask is not None else None
    return input_ids[:, :stop], mask, stop


def graft_metric(
    pair: PartialGraft, input_ids: torch.Tensor, alpha: torch.Tensor, *, positions: torch.Tensor,
    targets: torch.Tensor, metric: Metric = "first_logprob", distractors: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None, reference_logprobs: torch.Tensor | None = None,
    unit_alpha: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The metric ``[batch]`` at ``positions [batch]`` under the partial graft ``alpha`` (and
    ``unit_alpha``, see ``PartialGraft.forward``)."""
    logits = pair.forward(input_ids, alpha, attention_mask, logit_positions=positions[:, None], unit_alpha=unit_alpha)
    return metric_values(logits[:, 0].float() if logits.dtype != torch.float64 else logits[:, 0],
                         targets, metric, distractors, reference_logprobs)


def donor_logprobs(pair: PartialGraft, input_ids: torch.Tensor, positions: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The donor's next-token log-probabilities ``[batch, vocab]`` at ``positions`` (the reference
    of the metrics that need the donor's distribution)."""
    ids, mask, _ = _crop(input_ids, attention_mask, positions)
    ones = torch.ones(*ids.shape, len(pair.slots), dtype=torch.float32)
    with torch.no_grad():
        logits = pair.forward(ids, ones, mask, logit_positions=positions[:, None])
    return torch.log_softmax(logits[:, 0].double() if logits.dtype == torch.float64 else logits[:, 0].float(), -1)


def graft_attribution(
    pair: PartialGraft, input_ids: torch.Tensor, positions: torch.Tensor, *, targets: torch.Tensor,
    metric: Metric = "first_logprob", distractors: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None, steps: int = 1,
    start: torch.Tensor | None = None, end: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[batch, seq, n_slots]``: with ``steps == 1`` the gradient ``dM_b / da[b, t, s]`` at
    ``start`` (default 0: every cell's first-order effect); with ``steps > 1`` integrated
    gradients along ``start -> end`` (default 0 -> 1, midpoint rule). Positions after a row's
    scored position get 0 (nothing there can change it)."""
    return _attribution(pair, input_ids, positions, targets=targets, metric=metric, distractors=distractors, attention_mask=attention_mask, steps=steps,
                        start=start, end=end, unit_widths=None)[0]


def unit_slots(pair: PartialGraft, kind: Units) -> dict[str, int]:
    """Slot name -> number of units, for every slot that splits into ``kind`` units."""
    return {s.name: s.units(kind) for s in pair.slots if s.units(kind)}


def graft_unit_attribution(
    pair: PartialGraft, input_ids: torch.Tensor, positions: torch.Tensor, *, targets: torch.Tensor,
    kind: UnitKind, metric: Metric = "first_logprob", distractors: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None, steps: int = 1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``graft_attribution`` with every q/k/v/o slot split into heads (``kind="head"``) or
    every gate/up/down slot into neurons (``"neuron"``), in the same one backward pass:
    ``(cells [batch, seq, n_slots], {slot name: [batch, seq, units]})``. A split slot's entry
    in ``cells`` is what belongs to no unit (o's and down's bias; 0 where there is none), so
    a split slot's units plus that entry are its whole cell (exactly, for integrated gradients;
    to first order, for the gradient, where they sum to the unsplit cell's gradient)."""
    if kind not in (Units.HEAD, Units.NEURON):
        raise GraftArgumentError(f"kind must be 'head' or 'neuron', got {kind!r}")
    units = Units(kind)
    return _attribution(pair, input_ids, positions, targets=targets, metric=metric, distractors=distractors, attention_mask=attention_mask, steps=steps,
                        start=None, end=None, unit_widths=unit_slots(pair, units))


def _attribution(
    pair: PartialGraft, input_ids: torch.Tensor, positions: torch.Tensor, *, targets: torch.Tensor,
    metric: Metric, distractors: torch.Tensor | None, attention_mask: torch.Tensor | None, steps: int,
    start: torch.Tensor | None, end: torch.Tensor | None, unit_widths: Mapping[str, int] | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    if steps < 1:
        raise GraftArgumentError("steps must be at least 1")
    unit_widths = unit_widths or {}
    batch, seq = input_ids.shape
    n_slots = len(pair.slots)
    dtype = torch.promote_types(input_embedding_weight(pair.base).dtype, torch.float32)
    ids, mask, stop = _crop(input_ids, attention_mask, positions)
    a0 = (start if start is not None else torch.zeros(batch, seq, n_slots, dtype=dtype))[:, :stop]
    a1 = (end if end is not None else torch.ones(batch, seq, n_slots, dtype=dtype))[:, :stop]
    a0, a1 = a0.to(dtype), a1.to(dtype)
    reference = donor_logprobs(pair, ids, positions, mask) if localize_metric(metric).needs_donor else None
    total = torch.zeros(batch, stop, n_slots, dtype=dtype)
    unit_totals = {name: torch.zeros(batch, stop, n, dtype=dtype) for name, n in unit_widths.items()}
    with _frozen([pair.base, pair.donor]), torch.enable_grad():
        for j in range(steps):
            share = 0.0 if steps == 1 else (j + 0.5) / steps  # units go 0 -> 1 along the same path
            point = a0 if steps == 1 else a0 + share * (a1 - a0)
            alpha = point.detach().clone().requires_grad_(True)
            unit_alpha = {name: torch.full((batch, stop, n), share, dtype=dtype, requires_grad=True)
                          for name, n in unit_widths.items()}
            values = graft_metric(pair, ids, alpha, positions=positions, targets=targets, metric=metric, distractors=distractors, attention_mask=mask, reference_logprobs=reference,
                                  unit_alpha=unit_alpha or None)
            grads = torch.autograd.grad(values.sum(), [alpha, *unit_alpha.values()], allow_unused=True)
            total += grads[0].detach().to(total.device)
            for name, g in zip(unit_alpha, grads[1:]):
                if g is not None:
                    unit_totals[name] += g.detach().to(total.device)
    out = torch.zeros(batch, seq, n_slots, dtype=dtype)
    out[:, :stop] = total if steps == 1 else total / steps * (a1 - a0)
    unit_out = {}
    for name, t in unit_totals.items():
        full = torch.zeros(batch, seq, t.shape[-1], dtype=dtype)
        full[:, :stop] = t if steps == 1 else t / steps
        unit_out[name] = full
    return out, unit_out
