"""The weight layout of the projections that grafting splits by columns or heads, in one
place: ``nn.Linear`` stores ``[out, in]``, GPT-2's ``Conv1D`` stores ``[in, out]``. Every
other module (engine, adapters, the per-token reference) asks here instead of checking types.
A LoRA-wrapped projection (peft's ``lora.Linear``, ``weightgraft.engine.lora``) has the
layout of the projection it wraps, and its outputs include the adapter's share. A model's config and
its input embeddings' weight are read here too, with the types that torch's module attributes
(``Tensor | Module``) do not give."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from weightgraft.engine import lora
from weightgraft.errors import UnsupportedProjection as UnsupportedProjection

Index = torch.Tensor | slice


def hf_config(model: nn.Module) -> Any:
    """A Hugging Face model's ``config`` (torch types a module attribute as ``Tensor | Module``;
    a config's fields depend on the architecture)."""
    return model.config


def input_embedding_weight(model: nn.Module) -> torch.Tensor:
    """The weight of a Hugging Face model's input embeddings (where its device and dtype are read)."""
    # torch types a module attribute as ``Tensor | Module``: here a PreTrainedModel's method and
    # the embedding's Parameter
    embeddings = cast(Callable[[], nn.Module], model.get_input_embeddings)()
    return cast(torch.Tensor, embeddings.weight)


def _weight(module: nn.Module) -> torch.Tensor:
    """A projection's ``weight`` (torch types a module attribute as ``Tensor | Module``)."""
    return cast(torch.Tensor, module.weight)


def _bias(module: nn.Module) -> torch.Tensor | None:
    """A projection's ``bias``, None where it has none."""
    return cast("torch.Tensor | None", module.bias)


def _kind(module: nn.Module) -> str:
    module = lora.base_layer(module)
    if isinstance(module, Conv1D):
        return "conv1d"
    if isinstance(module, nn.Linear):
        return "linear"
    raise UnsupportedProjection(f"{type(module).__name__}: only Linear and Conv1D projections can be split")


def is_quantized(module: nn.Module) -> bool:
    """Whether ``module``'s own weights are stored quantized (bitsandbytes ``Params4bit`` /
    ``Int8Params``, a torchao tensor subclass): their entries are not the weights it applies,
    so only the module's own forward may read them."""
    return any(
        type(p) not in (torch.Tensor, nn.Parameter) or not p.dtype.is_floating_point
        for p in lora.base_layer(module).parameters(recurse=False)
    )


def _plain(module: nn.Module, what: str) -> nn.Module:
    """``module`` if its weight can be read entry by entry, else a one-line refusal naming it."""
    if is_quantized(module):
        raise UnsupportedProjection(
            f"{type(lora.base_layer(module)).__name__} (quantized): {what} needs entries of its weight, "
            "which the quantized layout does not expose; graft the module whole, or load the model unquantized"
        )
    return module


def in_features(module: nn.Module) -> int:
    """Width of the projection's input."""
    module = lora.base_layer(module)
    if _kind(module) == "conv1d":
        return int(_weight(module).shape[0])
    assert isinstance(module, nn.Linear)  # what _kind takes besides Conv1D
    return int(module.in_features)


def out_features(module: nn.Module) -> int:
    """Width of the projection's output."""
    module = lora.base_layer(module)
    if _kind(module) == "conv1d":
        return int(_weight(module).shape[1])
    assert isinstance(module, nn.Linear)  # what _kind takes besides Conv1D
    return int(module.out_features)


def out_index(module: nn.Module, cols: Index) -> tuple[Index, Index]:
    """Index of ``module.weight`` selecting output columns ``cols``."""
    _plain(module, "a split by output columns")
    return (slice(None), cols) if _kind(module) == "conv1d" else (cols, slice(None))


def in_index(module: nn.Module, cols: Index) -> tuple[Index, Index]:
    """Index of ``module.weight`` selecting input columns ``cols``."""
    _plain(module, "a split by input columns (per-head o, per-neuron down)")
    return (cols, slice(None)) if _kind(module) == "conv1d" else (slice(None), cols)


def output_columns(module: nn.Module, x: torch.Tensor, cols: Index) -> torch.Tensor:
    """Output columns ``cols`` of ``module(x)``, computing only those columns (bias included)."""
    if lora.is_lora(module):
        y = output_columns(lora.base_layer(module), x, cols)
        extra = lora.adapter_output(module, x, cols)
        return y if extra is None else y + extra
    conv1d = _kind(_plain(module, "a split by output columns")) == "conv1d"
    full_bias = _bias(module)
    if conv1d:
        assert full_bias is not None  # a Conv1D always has a bias
        w, b = _weight(module)[:, cols], full_bias[cols]
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
    bias = full_bias[cols] if full_bias is not None else None
    return F.linear(x, _weight(module)[cols], bias)


def matmul_no_bias(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` through the projection's weight alone (the bias added by the caller, once)."""
    if lora.is_lora(module):
        y = matmul_no_bias(lora.base_layer(module), x)
        extra = lora.adapter_output(module, x)
        return y if extra is None else y + extra
    _plain(module, "per-head o / per-neuron down (input columns)")
    return x @ _weight(module) if _kind(module) == "conv1d" else F.linear(x, _weight(module))


def is_projection(module: nn.Module) -> bool:
    """Whether ``module`` is a projection this module knows the layout of."""
    return isinstance(lora.base_layer(module), (nn.Linear, Conv1D))


def effective_weight(module: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The weight ``module`` applies, in ``dtype``: a LoRA layer's ``W + scale * B A``
    (its ``.weight`` is the wrapped projection's alone)."""
    w = _weight(_plain(lora.base_layer(module), "mixing weights (a partial graft)")).detach().to(dtype)
    delta = lora.delta_weight(module) if lora.is_lora(module) else None
    return w if delta is None else w + delta.detach().to(dtype)


def apply_weight(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` through ``weight`` (+ ``bias``) laid out as ``module.weight`` is (e.g. a weight
    difference of two such modules)."""
    y = x @ weight if _kind(module) == "conv1d" else F.linear(x, weight)
    return y if bias is None else y + bias
