"""The pieces every recurrent mixer's batched forward is made of, each exact per position: a
multi-input per-token module run row by row by the model serving each position, the causal
depthwise convolution with each output position's own kernel, per-token parameters gathered by
the serving model, and padding zeroed without multiplying (``0 * NaN`` is NaN)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from weightgraft.engine import lora
from weightgraft.errors import GraftArgumentTypeError

__all__ = ["by_rows", "gathered", "kernels", "per_position_conv", "single_model", "zero_pads"]


def single_model(maps: Sequence[torch.Tensor]) -> int | None:
    """The one model serving every position of every map, None where several do."""
    present = torch.unique(torch.stack([m.reshape(-1) for m in maps])).tolist()
    return int(present[0]) if len(present) == 1 else None


def mixer_models(targets: list[nn.Module], maps: Sequence[torch.Tensor],
                 norm: str = "norm") -> tuple[Any, Callable[..., Any] | None, list[nn.Module]]:
    """``(base, whole, norms)`` of a mixer forward: the base's mixer, the one model's own forward
    where a single model serves every component (else None), and each model's gated norm (the
    mixer's attribute ``norm``)."""
    from weightgraft.engine.swaps import own_forward

    base: Any = targets[0]  # transformers modules: their submodules and sizes are plain attributes
    single = single_model(list(maps))
    whole = own_forward(base) if single == 0 else targets[single] if single is not None else None
    return base, whole, [getattr(t, norm) for t in targets]


def zero_pads(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``x [batch, seq, ...]`` with padded positions zero. ``torch.where``, not a product: a padded
    row may hold NaN (an eager attention row with every key masked), and ``NaN * 0`` is NaN, which a
    convolution or a recurrent state would carry into real positions."""
    if attention_mask is None:
        return x
    keep = attention_mask.bool().reshape(*attention_mask.shape, *([1] * (x.dim() - 2)))
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


def by_rows(modules: Sequence[Callable[..., torch.Tensor]], models: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """A per-token module of several inputs (a gated norm: values and gate), each ``[batch, seq,
    ...]``, computed at each position by the module of the model ``models [batch, seq]`` names."""
    present: list[int] = torch.unique(models).tolist()
    if len(present) == 1:
        whole: torch.Tensor = modules[present[0]](*inputs)
        return whole
    out: torch.Tensor | None = None
    for m in present:
        b, t = (models == m).nonzero(as_tuple=True)
        y = modules[m](*(x[b, t] for x in inputs))
        if out is None:
            out = y.new_empty(*models.shape, *y.shape[1:])
        out[b, t] = y
    assert out is not None  # some model serves
    return out


def kernels(convs: Sequence[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per model, a depthwise conv's kernel ``[models, channels, width]`` and bias ``[models,
    channels]`` (None without one): read as tensors, since HF applies them without calling the
    conv module (so a LoRA layer on it would be skipped, and is refused)."""
    for conv in convs:
        if lora.is_lora(conv):
            raise GraftArgumentTypeError(
                f"a LoRA adapter on a mixer's convolution ({type(lora.base_layer(conv)).__name__}) is read past by "
                "the model's own kernel; give a merged donor (weightgraft.models.peft_donor.merged_copy)")
    weight = torch.stack([_tensor(c, "weight").squeeze(1) for c in convs])
    biases = [c.bias for c in convs]
    bias = None if biases[0] is None else torch.stack([_tensor(c, "bias") for c in convs])
    return weight, bias


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    value = getattr(module, name)  # nn.Module's stubs type a parameter as ``Tensor | Module``
    assert isinstance(value, torch.Tensor)  # a conv's weight, and its bias where it has one
    return value


def per_position_conv(full: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      models: torch.Tensor) -> torch.Tensor:
    """The causal depthwise convolution where output position p uses the kernel (and bias) of
    the model ``models [batch, seq]`` names for p, over the inputs ``full [batch, channels, L]``
    (each position's own value, as its own model computed it; a cache's earlier columns first, the
    ``seq`` new ones last). ``weight [models, channels, K]``: tap K-1 multiplies position p, as in
    ``F.conv1d``. Returns ``[batch, seq, channels]``, the new positions only."""
    seq = models.shape[1]
    width = weight.shape[-1]
    windows = F.pad(full, (width - 1, 0)).unfold(-1, width, 1)[:, :, -seq:]  # [batch, channels, seq, K]
    out = torch.einsum("bctk,btck->btc", windows.to(weight.dtype), weight[models])
    return out if bias is None else out + bias[models]


def gathered(tensors: Sequence[torch.Tensor], models: torch.Tensor) -> torch.Tensor:
    """Per-token parameters ``[batch, seq, ...]``: at each position the tensor of the model
    ``models`` names (a mixer's ``A_log``, ``dt_bias``)."""
    return torch.stack(list(tensors))[models]
