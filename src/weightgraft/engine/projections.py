"""The weight layout of the projections that grafting splits by columns or heads, in one
place: ``nn.Linear`` stores ``[out, in]``, GPT-2's ``Conv1D`` stores ``[in, out]``. Every
other module (engine, adapters, the per-token reference) asks here instead of checking types.
A LoRA-wrapped projection (peft's ``lora.Linear``, ``weightgraft.engine.lora``) has the
layout of the projection it wraps, and its outputs include the adapter's share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from weightgraft.engine import lora
from weightgraft.errors import WeightgraftError

Index = torch.Tensor | slice


class UnsupportedProjection(WeightgraftError, TypeError):
    """A module that is neither ``nn.Linear`` nor ``Conv1D`` where one of them is needed."""


def _kind(module: nn.Module) -> str:
    module = lora.base_layer(module)
    if isinstance(module, Conv1D):
        return "conv1d"
    if isinstance(module, nn.Linear):
        return "linear"
    raise UnsupportedProjection(f"{type(module).__name__}: only Linear and Conv1D projections can be split")


def in_features(module: nn.Module) -> int:
    """Width of the projection's input."""
    module = lora.base_layer(module)
    return int(module.weight.shape[0] if _kind(module) == "conv1d" else module.in_features)


def out_features(module: nn.Module) -> int:
    """Width of the projection's output."""
    module = lora.base_layer(module)
    return int(module.weight.shape[1] if _kind(module) == "conv1d" else module.out_features)


def out_index(module: nn.Module, cols: Index) -> tuple[Index, Index]:
    """Index of ``module.weight`` selecting output columns ``cols``."""
    return (slice(None), cols) if _kind(module) == "conv1d" else (cols, slice(None))


def in_index(module: nn.Module, cols: Index) -> tuple[Index, Index]:
    """Index of ``module.weight`` selecting input columns ``cols``."""
    return (cols, slice(None)) if _kind(module) == "conv1d" else (slice(None), cols)


def output_columns(module: nn.Module, x: torch.Tensor, cols: Index) -> torch.Tensor:
    """Output columns ``cols`` of ``module(x)``, computing only those columns (bias included)."""
    if lora.is_lora(module):
        y = output_columns(lora.base_layer(module), x, cols)
        extra = lora.adapter_output(module, x, cols)
        return y if extra is None else y + extra
    if _kind(module) == "conv1d":
        w, b = module.weight[:, cols], module.bias[cols]
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
    bias = module.bias[cols] if module.bias is not None else None
    return F.linear(x, module.weight[cols], bias)


def matmul_no_bias(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` through the projection's weight alone (the bias added by the caller, once)."""
    if lora.is_lora(module):
        y = matmul_no_bias(lora.base_layer(module), x)
        extra = lora.adapter_output(module, x)
        return y if extra is None else y + extra
    return x @ module.weight if _kind(module) == "conv1d" else F.linear(x, module.weight)


def is_projection(module: nn.Module) -> bool:
    """Whether ``module`` is a projection this module knows the layout of."""
    return isinstance(lora.base_layer(module), (nn.Linear, Conv1D))


def effective_weight(module: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The weight ``module`` applies, in ``dtype``: a LoRA layer's ``W + scale * B A``
    (its ``.weight`` is the wrapped projection's alone)."""
    w = lora.base_layer(module).weight.detach().to(dtype)
    delta = lora.delta_weight(module) if lora.is_lora(module) else None
    return w if delta is None else w + delta.detach().to(dtype)


def apply_weight(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` through ``weight`` (+ ``bias``) laid out as ``module.weight`` is (e.g. a weight
    difference of two such modules)."""
    y = x @ weight if _kind(module) == "conv1d" else F.linear(x, weight)
    return y if bias is None else y + bias
