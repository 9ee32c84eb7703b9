"""Models loaded quantized, the way users load them: transformers' ``from_pretrained`` with a
``quantization_config`` (bitsandbytes nf4 / fp4 / int8, torchao int8 weight-only).

The engine grafts a quantized module whole (each row group through its own model's quantized
module); nothing here dequantizes. A package rather than a module only because ``models/``
holds the folder limit of modules (tests/test_architecture.py); import it as
``weightgraft.models.quantization``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn

from weightgraft.engine.projections import is_quantized
from weightgraft.errors import WeightgraftError

__all__ = ["QUANTIZATIONS", "REFUSED", "QuantizationError", "quantization_config", "load_quantized",
           "quantized_modules"]

# Schemes that load and graft on a CPU (bitsandbytes >= 0.45 has CPU kernels) and on a GPU.
QUANTIZATIONS: tuple[str, ...] = ("nf4", "fp4", "int8", "torchao-int8")
# Names users ask for that this build refuses, with why (one line each).
REFUSED: dict[str, str] = {
    "torchao-int4": "torchao-int4 is refused: torchao's int4 weight-only layouts need its mslk CUDA "
                    "kernels (no CPU path in torchao 0.18); use nf4 or fp4 (bitsandbytes 4-bit) or torchao-int8",
}
_PACKAGE = {"nf4": "bitsandbytes", "fp4": "bitsandbytes", "int8": "bitsandbytes", "torchao-int8": "torchao"}


class QuantizationError(WeightgraftError, ValueError):
    """A quantization scheme that is unknown, refused, or whose package is not installed."""


def _check(scheme: str) -> None:
    if scheme in REFUSED:
        raise QuantizationError(REFUSED[scheme])
    if scheme not in QUANTIZATIONS:
        raise QuantizationError(f"unknown quantization {scheme!r}; choose one of {', '.join(QUANTIZATIONS)}")
    package = _PACKAGE[scheme]
    if importlib.util.find_spec(package) is None:
        raise QuantizationError(f"quantization {scheme!r} needs {package}: pip install 'weightgraft[quant]'")


def quantization_config(scheme: str, dtype: torch.dtype = torch.float32, int8_threshold: float = 0.0) -> Any:
    """transformers' ``QuantizationConfig`` for ``scheme``, computing in ``dtype`` (the dtype the
    model loads in): what ``from_pretrained(..., quantization_config=...)`` takes.

    ``int8`` defaults to ``llm_int8_threshold=0.0`` (plain row-wise int8): LLM.int8's outlier
    split (transformers' default 6.0) picks outlier columns across all rows of a call, so a
    token's output depends on the rows beside it and no batched graft can equal the per-token
    definition (measured: 2.5e-2 on one tiny module, 3.5e-2 on the logits). Pass 6.0 for
    LLM.int8's quality on large models, knowing the graft is then approximate."""
    _check(scheme)
    from transformers import BitsAndBytesConfig, TorchAoConfig

    if scheme in ("nf4", "fp4"):
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=scheme, bnb_4bit_compute_dtype=dtype)
    if scheme == "int8":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=int8_threshold)
    from torchao.quantization import Int8WeightOnlyConfig

    return TorchAoConfig(Int8WeightOnlyConfig())


def load_quantized(
    path: str | Path, scheme: str, dtype: torch.dtype = torch.float32, device_map: str | dict | None = "cpu",
) -> nn.Module:
    """The saved model at ``path`` loaded quantized by transformers (the path users take), in
    eval mode; a one-line :class:`QuantizationError` for a scheme that cannot load here."""
    from transformers import AutoModelForCausalLM

    config = quantization_config(scheme, dtype)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), quantization_config=config, dtype=dtype, device_map=device_map,
    )
    return model.eval()


def quantized_modules(model: nn.Module) -> list[str]:
    """Paths of the modules whose weights are stored quantized (what a graft runs whole)."""
    return [name for name, module in model.named_modules() if is_quantized(module)]
