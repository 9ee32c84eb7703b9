"""Precision: half precision without batch dependence (eager attention), float64 that stays
float64 through HF's float32 casts, and 4-bit layers that compute the same on every CPU."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from weightgraft.errors import GraftArgumentError

HALF_DTYPES = frozenset({torch.bfloat16, torch.float16})


_int8_exact: list[bool] = []


def _int8_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.matmul(A.double(), B.double().t()).to(torch.int32)  # exact: |sums| < 2**53


def _int8_matmul_out(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(_int8_matmul(A, B))


def exact_int8_matmul() -> None:
    """bitsandbytes' int8 matmul on the CPU as one exact kernel on every CPU (once per process).

    bitsandbytes 0.50 picks its CPU kernel by the CPU: with AVX-512, ``torch._int_mm`` (oneDNN),
    which on a CPU without AVX512-VNNI (Skylake-SP Xeons; reproduced here with
    ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``) saturates its 16-bit intermediate sums: int32 results off by
    up to 135,405 on a 1536-wide product, SmolLM2-135M int8's logits off by 5.4; without AVX-512, a
    float32 matmul, inexact once a sum passes 2**24. The products of int8 values summed in float64
    are exact integers on every CPU."""
    if _int8_exact:
        return
    torch.library.register_kernel("bitsandbytes::int8_linear_matmul", "cpu", _int8_matmul)
    torch.library.register_kernel("bitsandbytes::int8_linear_matmul.out", "cpu", _int8_matmul_out)
    _int8_exact.append(True)


def one_cpu_path(models: Iterable[nn.Module]) -> int:
    """Keep every bitsandbytes 4-bit layer of ``models`` on the one CPU path that every CPU runs,
    in place and for good; the number of such layers.

    On a CPU with AVX512-BF16, bitsandbytes (0.45 to at least 0.50) rewrites a ``Linear4bit``'s
    weight in place the first time it runs in eval mode without gradients: the 4-bit codes are
    regrouped for its fused kernel and the block scales (absmax) are cast to bfloat16. So on
    such a CPU, and only there, a layer with fewer than 64 inputs raises (``shape '[32, 0]' is
    invalid``), outputs move off the dequantized weights (0.30 in SmolLM2-135M nf4's logits), the
    model's weights hash changes after its first forward and its first two forwards differ.
    Turning the layer's ``support_avx512bf16_for_cpu`` off before its first call keeps the
    dequantize-then-matmul path of every other CPU. A layer already rewritten cannot be brought
    back exactly (its scales were rounded to bfloat16): it is refused in one line. A model with
    bitsandbytes int8 layers gets :func:`exact_int8_matmul`.
    """
    count = 0
    for model in models:
        for name, module in model.named_modules():
            if type(module).__name__ == "Linear8bitLt":
                exact_int8_matmul()
            if not hasattr(module, "support_avx512bf16_for_cpu"):
                continue
            state = getattr(getattr(module, "weight", None), "quant_state", None)
            if getattr(state, "packing_format_for_cpu", False):
                raise GraftArgumentError(
                    f"{name or type(module).__name__}: this 4-bit layer already ran on bitsandbytes' AVX512-BF16 "
                    "CPU path, which rewrote its weight with bfloat16 scales; load the model with weightgraft.load "
                    "(or call weightgraft.engine.precision.one_cpu_path(model) before its first forward)")
            module.support_avx512bf16_for_cpu = False
            count += 1
    return count


def is_half(model: nn.Module) -> bool:
    """Whether the model's floating-point parameters are bfloat16 or float16."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype in HALF_DTYPES
    return False


def _half_configs(models: Iterable[nn.Module]) -> list[Any]:
    """The attention configs of the half-precision models (each config once)."""
    configs: dict[int, Any] = {}
    for model in models:
        if not is_half(model):
            continue
        for module in model.modules():
            cfg = getattr(module, "config", None)
            if cfg is not None and hasattr(cfg, "_attn_implementation"):
                configs.setdefault(id(cfg), cfg)
                for key in getattr(cfg, "sub_configs", {}):  # the setter recurses into these
                    sub = getattr(cfg, key, None)
                    if sub is not None and hasattr(sub, "_attn_implementation"):
                        configs.setdefault(id(sub), sub)
    return list(configs.values())


def batch_invariant_attention(models: Iterable[nn.Module]) -> None:
    """Switch half-precision models to HF's eager attention, in place and for good: for
    models weightgraft loads itself. A user's models get :func:`eager_attention` instead.

    HF's SDPA (and flash) kernels round a padded row differently from the same row alone (on
    SmolLM2 in bfloat16: up to 0.55 logits at a real position; ~27 logits at a padded one), so
    a prompt's numbers would depend on which other prompts share its batch. Eager attention
    gives each row the same numbers in any batch. float32 and float64 models are left alone.
    """
    for cfg in _half_configs(models):
        cfg._attn_implementation = "eager"


def switch_to_eager(models: Iterable[nn.Module]) -> Callable[[], None]:
    """:func:`batch_invariant_attention` until the returned function is called: it gives every
    config back the attention implementation it had (the user's model is theirs again)."""
    saved = [(cfg, cfg._attn_implementation) for cfg in _half_configs(models)]

    def restore() -> None:
        for cfg, before in saved:  # each config's own value (the setter would recurse into sub-configs)
            cfg._attn_implementation_internal = before

    try:
        for cfg, _ in saved:
            cfg._attn_implementation = "eager"
    except BaseException:
        restore()
        raise
    return restore


@contextmanager
def eager_attention(models: Iterable[nn.Module]) -> Iterator[None]:
    """:func:`switch_to_eager` for the block, restored on any exit."""
    restore = switch_to_eager(models)
    try:
        yield
    finally:
        restore()


class _Float64Casts(TorchFunctionMode):
    """Every cast to float32 inside it becomes a cast to float64."""

    def __torch_function__(self, func: Callable[..., Any], types: Iterable[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func in _CASTS:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


_CASTS = (torch.Tensor.to, torch.Tensor.type)


def is_float64(models: Iterable[nn.Module]) -> bool:
    """Whether every model's floating-point parameters are float64."""
    for model in models:
        for p in model.parameters():
            if p.is_floating_point():
                if p.dtype != torch.float64:
                    return False
                break
    return True


@contextmanager
def float64_exact(models: Iterable[nn.Module]) -> Iterator[None]:
    """Within it, float64 models compute in float64 throughout.

    HF's modelling code casts to float32 in places even in a float64 model: the Llama-family
    RMSNorms (``hidden_states.to(torch.float32)``), Gemma's ``.float()`` norms, OLMo's float32
    LayerNorm, rotary cos/sin, eager attention's ``softmax(..., dtype=torch.float32)``. A
    float64 forward pass is then only float32-accurate, and two passes that reach a norm with
    values differing in the last float64 bits (a batched pass and a position-by-position one)
    can round to neighbouring float32 values (~7e-8 relative) that later layers amplify. Here
    every such cast keeps float64, whatever the architecture, and is undone on exit. Models in
    any other dtype run unchanged.
    """
    models = list(models)
    if not is_float64(models):
        yield
        return
    with _Float64Casts(), _eager_experts(models):
        yield


@contextmanager
def _eager_experts(models: list[nn.Module]) -> Iterator[None]:
    """A mixture of experts' bank runs transformers' eager loop (``grouped_mm``, the default,
    refuses float64 on CPU), restored on exit."""
    before = [getattr(getattr(m, "config", None), "_experts_implementation", None) for m in models]
    switched = [m for m, b in zip(models, before, strict=True) if b not in (None, "eager")]
    for m in switched:
        m.set_experts_implementation("eager")  # type: ignore[operator]  # a transformers model's method
    try:
        yield
    finally:
        for m, b in zip(models, before, strict=True):
            if m in switched:
                m.set_experts_implementation(b)  # type: ignore[operator]
