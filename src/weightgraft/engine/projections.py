"""The weight layout of the projections that grafting splits by columns or heads, in one
place: ``nn.Linear`` stores ``[out, in]``, GPT-2's ``Conv1D`` stores ``[in, out]``. Every
other module (engine, adapters, the per-token reference) asks here instead of checking types."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

Index = torch.Tensor | slice


class UnsupportedProjection(TypeError):
    """A module that is neither ``nn.Linear`` nor ``Conv1D`` where one of them is needed."""


def _kind(module: nn.Module) -> str:
    if isinstance(module, Conv1D):
        return "conv1d"
    if isinstance(module, nn.Linear):
        return "linear"
    raise UnsupportedProjection(f"{type(module).__name__}: only Linear and Conv1D projections can be split")


def in_features(module: nn.Module) -> int:
    """Width of the projection's input."""
    return int(module.weight.shape[0] if _kind(module) == "conv1d" else module.in_features)


def out_features(module: nn.Module) -> int:
    """Width of the projection's output."""
    return int(module.weight.shape[1] if _kind(module) == "conv1d" else module.out_features)


def out_index(module: nn.Module, cols: Index) -> tuple[Index, Index]:
    """Index of ``module.weight`` selecting output columns ``cols``."""
    return (slice(None), cols) if _kind(module) == "conv1d" else (cols, slice(None))


def in_index(module: nn.Module, cols: Index) -> tuple[Index, Index]:
    """Index of ``module.weight`` selecting input columns ``cols``."""
    return (cols, slice(None)) if _kind(module) == "conv1d" else (slice(None), cols)


def output_columns(module: nn.Module, x: torch.Tensor, cols: Index) -> torch.Tensor:
    """Output columns ``cols`` of ``module(x)``, computing only those columns (bias included)."""
    if _kind(module) == "conv1d":
        w, b = module.weight[:, cols], module.bias[cols]
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
    bias = module.bias[cols] if module.bias is not None else None
    return F.linear(x, module.weight[cols], bias)


def matmul_no_bias(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` through the projection's weight alone (the bias added by the caller, once)."""
    return x @ module.weight if _kind(module) == "conv1d" else F.linear(x, module.weight)


def is_projection(module: nn.Module) -> bool:
    """Whether ``module`` is a projection this module knows the layout of."""
    return isinstance(module, (nn.Linear, Conv1D))


def apply_weight(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` through ``weight`` (+ ``bias``) laid out as ``module.weight`` is (e.g. a weight
    difference of two such modules)."""
    y = x @ weight if _kind(module) == "conv1d" else F.linear(x, weight)
    return y if bias is None else y + bias
