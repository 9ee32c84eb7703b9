"""The batched grafting forward pass.

One forward pass of the base model in which every grafted module's output, at the grafted
positions only, is replaced by the donor module applied to the same input. Keys and values
at position t are then computed with the weights chosen for t, exactly as in the per-token
KV-cache definition (``weightgraft.reference``), but for a whole batch at once and with
donor work done only on grafted rows.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from weightgraft.architectures import Slot, model_slots
from weightgraft.compat import check_compatible

__all__ = ["slots", "graft_forward", "position_ids_from_mask"]


def slots(model: nn.Module) -> list[str]:
    """The graftable slots of ``model``: ``embed``, ``layers.{i}.{component}``, ``final_norm``,
    ``unembed``, in that fixed order (the last axis of a ``source`` tensor)."""
    return [s.name for s in model_slots(model)]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore padding on either side (left padding needs this to be exact)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp_(min=0)


@dataclass
class _Graft:
    """Rows (b, t) of one part whose output comes from one donor module."""

    donor: nn.Module
    columns: torch.Tensor | slice | None
    pos_axis: int
    b: torch.Tensor
    t: torch.Tensor


def _as_index(columns: torch.Tensor | None) -> torch.Tensor | slice | None:
    """A contiguous column set becomes a slice, so weights are viewed, not copied."""
    if columns is None:
        return None
    start, n = int(columns[0]), columns.numel()
    if torch.equal(columns, torch.arange(start, start + n)):
        return slice(start, start + n)
    return columns


def _donor_output(g: _Graft, x: torch.Tensor) -> torch.Tensor:
    module = g.donor
    if g.columns is None:
        return module(x)
    cols = g.columns
    if isinstance(module, Conv1D):  # GPT-2: weight is [in, out]
        w = module.weight[:, cols]
        b = module.bias[cols]
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
    if isinstance(module, nn.Linear):
        bias = module.bias[cols] if module.bias is not None else None
        return F.linear(x, module.weight[cols], bias)
    raise TypeError(f"column grafting on {type(module).__name__} is not supported")


def _make_hook(grafts: list[_Graft]):
    def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        x = args[0] if args else next(iter(kwargs.values()))
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"cannot graft {type(module).__name__}: its output is not a tensor")
        y = output.clone() if output.requires_grad else output
        for g in grafts:
            xv = x if g.pos_axis == 1 else x.movedim(g.pos_axis, 1)
            yv = y if g.pos_axis == 1 else y.movedim(g.pos_axis, 1)
            value = _donor_output(g, xv[g.b, g.t]).to(yv.dtype)
            if g.columns is None:
                yv[g.b, g.t] = value
            elif isinstance(g.columns, slice):
                yv[g.b, g.t, g.columns] = value
            else:
                yv[g.b[:, None], g.t[:, None], g.columns[None, :]] = value
        return y

    return hook


def _plan_grafts(
    models: Sequence[nn.Module], slot_list: list[Slot], columns: list[torch.Tensor]
) -> dict[str, list[_Graft]]:
    """Group the grafted (slot, donor) row sets by the base module they patch.

    ``columns[s]`` is the ``[batch, rows]`` model-index map of slot ``s``.
    """
    by_module: dict[str, list[_Graft]] = defaultdict(list)
    for s, column in enumerate(columns):
        if not bool((column != 0).any()):
            continue
        for m in column.unique().tolist():
            if m == 0:
                continue
            b, t = (column == m).nonzero(as_tuple=True)
            for part in slot_list[s].parts:
                cols = _as_index(part.columns)
                if isinstance(cols, torch.Tensor):
                    cols = cols.to(column.device)
                by_module[part.path].append(
                    _Graft(models[m].get_submodule(part.path), cols, part.pos_axis, b, t)
                )
    return by_module


def _gather_rows(positions: torch.Tensor):
    """Pre-hook for the unembedding: keep only the hidden states at ``positions``."""

    def hook(module: nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        index = positions[:, :, None].expand(-1, -1, hidden.shape[-1])
        return (hidden.gather(1, index), *args[1:])

    return hook


@contextlib.contextmanager
def _eval_mode(models: Sequence[nn.Module]) -> Iterator[None]:
    modes = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        yield
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


def graft_forward(
    models: Sequence[nn.Module],
    input_ids: torch.Tensor,
    source: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    logit_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]`` of one batched forward pass in which slot ``s`` at
    position ``t`` of row ``b`` uses the weights of ``models[source[b, t, s]]``.

    ``models[0]`` is the base; all models must share architecture and shapes. Padding (left
    or right) is handled through ``attention_mask``. With ``logit_positions`` (``[batch, k]``
    position indices) only those logits are computed and ``[batch, k, vocab]`` is returned:
    the unembedding, usually the largest matrix, then runs on k rows instead of seq.
    """
    if len(models) == 0:
        raise ValueError("graft_forward needs at least one model (the base)")
    base = models[0]
    check_compatible(models)
    slot_list = model_slots(base)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
    batch, seq = input_ids.shape
    expected = (batch, seq, len(slot_list))
    if tuple(source.shape) != expected:
        raise ValueError(
            f"source must have shape [batch, seq, n_slots] = {list(expected)}, "
            f"got {list(source.shape)} (see weightgraft.slots(model))"
        )
    if source.dtype.is_floating_point or source.dtype == torch.bool:
        raise TypeError(f"source must be an integer tensor, got {source.dtype}")
    device = base.get_input_embeddings().weight.device
    source = source.to(device=device, dtype=torch.long)
    if source.numel() and (int(source.min()) < 0 or int(source.max()) >= len(models)):
        raise ValueError(
            f"source values must index the {len(models)} models (0..{len(models) - 1}), "
            f"found range {int(source.min())}..{int(source.max())}"
        )
    input_ids = input_ids.to(device)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    if attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids")
    position_ids = position_ids_from_mask(attention_mask)

    columns = [source[:, :, s] for s in range(len(slot_list))]
    handles = []
    try:
        if logit_positions is not None:
            logit_positions = logit_positions.to(device=device, dtype=torch.long)
            if logit_positions.dim() != 2 or logit_positions.shape[0] != batch:
                raise ValueError("logit_positions must be [batch, k] position indices")
            if int(logit_positions.min()) < 0 or int(logit_positions.max()) >= seq:
                raise ValueError(f"logit_positions must lie in 0..{seq - 1}")
            unembed = len(slot_list) - 1  # "unembed" is always the last slot
            columns[unembed] = columns[unembed].gather(1, logit_positions)
            head = base.get_submodule(slot_list[unembed].parts[0].path)
            handles.append(head.register_forward_pre_hook(_gather_rows(logit_positions)))
        for path, grafts in _plan_grafts(models, slot_list, columns).items():
            module = base.get_submodule(path)
            handles.append(
                module.register_forward_hook(_make_hook(grafts), with_kwargs=True)
            )
        with _eval_mode(models):
            out = base(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
            )
    finally:
        for h in handles:
            h.remove()
    return out.logits
