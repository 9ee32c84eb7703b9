"""LoRA-wrapped projections (peft's ``lora.Linear``) as the engine sees them.

A LoRA donor (``weightgraft.models.peft_donor``) is the base model with some projections
wrapped by peft: the wrapper computes ``base_layer(x) + B A x * scale`` and keeps the
projection itself as ``base_layer``. Its ``.weight`` is peft's property for the *base*
weight, so code that reads a donor's weight directly (column splits, per-head o, partial
deltas) would silently drop the adapter. Every such place asks here instead: the layout of
the wrapped projection, the adapter's share of chosen output columns, and the effective
weight ``W + scale * B A``. Nothing here imports peft (modules are recognised by shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from weightgraft.errors import UnsupportedLora as UnsupportedLora

__all__ = [
    "UnsupportedLora",
    "adapter_output",
    "base_layer",
    "canonical_name",
    "check_supported",
    "delta_weight",
    "has_lora",
    "is_lora",
    "same_projection",
]


class _LoraLayer(Protocol):
    """What is read here of a peft LoRA layer (see :func:`_layer`)."""

    base_layer: nn.Module
    active_adapters: list[str]
    lora_A: Mapping[str, nn.Linear]  # nn.ModuleDicts
    lora_B: Mapping[str, nn.Linear]
    lora_dropout: Mapping[str, nn.Module]
    scaling: dict[str, float]

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def _layer(module: nn.Module) -> _LoraLayer:
    # peft's attributes, which nn.Module's stubs type as ``Tensor | Module``
    return cast(_LoraLayer, module)


def is_lora(module: nn.Module) -> bool:
    """Whether ``module`` is a peft tuner layer wrapping a ``base_layer``."""
    return (
        type(module).__module__.startswith("peft.")
        and isinstance(getattr(module, "base_layer", None), nn.Module)
    )


def has_lora(model: nn.Module) -> bool:
    """Whether any module of ``model`` is a peft tuner layer."""
    return any(is_lora(m) for m in model.modules())


def base_layer(module: nn.Module) -> nn.Module:
    """The projection a peft layer wraps (the module itself when it is not wrapped)."""
    while is_lora(module):
        module = _layer(module).base_layer
    return module


def canonical_name(name: str) -> str | None:
    """A parameter's name as in the unwrapped model (``q_proj.base_layer.weight`` ->
    ``q_proj.weight``); None for the adapter's own tensors (``lora_A``, ``lora_B``, ...)."""
    parts = name.split(".")
    if any(p.startswith("lora_") for p in parts):
        return None
    return ".".join(p for p in parts if p != "base_layer")


def _active(module: nn.Module) -> list[str]:
    """The adapters a peft layer's forward adds, as its own forward decides it."""
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return []
    layer = _layer(module)
    names = [a for a in layer.active_adapters if a in layer.lora_A]
    for a in names:
        if a in getattr(module, "lora_variant", {}):
            raise UnsupportedLora(f"adapter {a!r} is a LoRA variant (e.g. DoRA); only plain LoRA can be grafted")
        if getattr(module, "lora_bias", {}).get(a):
            raise UnsupportedLora(f"adapter {a!r} has a LoRA bias (lora_bias=True); only plain LoRA can be grafted")
    return names


def check_supported(model: nn.Module, where: str) -> None:
    """Refuse peft layers the engine cannot serve exactly, in one line naming the module."""
    for path, module in model.named_modules():
        if not is_lora(module):
            continue
        inner = base_layer(module)
        if not isinstance(inner, (nn.Linear, Conv1D)) or not isinstance(getattr(module, "lora_A", None), nn.ModuleDict):
            raise UnsupportedLora(
                f"{where}: {path} is a peft {type(module).__name__} around a {type(inner).__name__}; "
                "only LoRA on Linear / Conv1D projections can be grafted (merge the adapter instead)"
            )
        if any(len(getattr(module, k, {})) for k in ("lora_embedding_A", "lora_magnitude_vector")):
            raise UnsupportedLora(f"{where}: {path} carries an embedding or DoRA adapter; only plain LoRA can be grafted")
        try:
            _active(module)
        except UnsupportedLora as exc:
            raise UnsupportedLora(f"{where}: {path}: {exc}") from None


def adapter_output(
    module: nn.Module, x: torch.Tensor, cols: torch.Tensor | slice | None = None, dtype: torch.dtype | None = None,
) -> torch.Tensor | None:
    """``sum_a scale_a * B_a[cols] A_a x`` of a LoRA layer (output columns ``cols``, all when
    None) in ``x``'s dtype, as its forward adds it (computed in ``dtype`` when given, else in
    the adapter's); None when no adapter is active or ``module`` is no LoRA layer."""
    if not is_lora(module):
        return None
    layer = _layer(module)
    out = None
    for a in _active(module):
        w_a, w_b = layer.lora_A[a].weight, layer.lora_B[a].weight
        if dtype is not None:
            w_a, w_b = w_a.to(dtype), w_b.to(dtype)
        h = F.linear(layer.lora_dropout[a](x.to(w_a.dtype)), w_a)
        y = F.linear(h, w_b if cols is None else w_b[cols]) * layer.scaling[a]
        out = y if out is None else out + y
    return None if out is None else out.to(dtype or x.dtype)


def same_projection(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules (LoRA-wrapped or not) wrap the very same weight and bias tensors, as
    a LoRA donor's layers and its base's do: they then differ by their adapters alone."""
    x, y = base_layer(a), base_layer(b)
    return x.weight is y.weight and getattr(x, "bias", None) is getattr(y, "bias", None)


def delta_weight(module: nn.Module) -> torch.Tensor | None:
    """``sum_a scale_a * B_a A_a`` laid out as the wrapped projection's weight (peft's own
    ``get_delta_weight``, the same the merge adds); None when no adapter is active."""
    out = None
    for a in _active(module):
        d = _layer(module).get_delta_weight(a)
        out = d if out is None else out + d
    return out
