"""Loading quantized: the transformers quantization config of a scheme, a saved model loaded
with it, and a model in memory (a ``random:`` model) quantized by a round trip through a
temporary folder, the path transformers' quantizers take."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from weightgraft.engine.precision import one_cpu_path
from weightgraft.engine.projections import is_quantized
from weightgraft.models.quantization.schemes import check_installed, quantizes_nothing

__all__ = ["quantization_config", "load_quantized", "quantize_in_memory", "quantized_modules", "require_quantized",
           "spec_config"]


def quantization_config(scheme: str, dtype: torch.dtype = torch.float32, int8_threshold: float = 0.0) -> Any:
    """transformers' ``QuantizationConfig`` for ``scheme``, computing in ``dtype`` (the dtype the
    model loads in): what ``from_pretrained(..., quantization_config=...)`` takes.

    ``int8`` defaults to ``llm_int8_threshold=0.0`` (plain row-wise int8): LLM.int8's outlier
    split (transformers' default 6.0) picks outlier columns across all rows of a call, so a
    token's output depends on the rows beside it and no batched graft can equal the per-token
    definition (measured: 2.5e-2 on one tiny module, 3.5e-2 on the logits). Pass 6.0 for
    LLM.int8's quality on large models, knowing the graft is then approximate."""
    check_installed(scheme)
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
    require_quantized(model, f"quantized({path}, {scheme})", config)
    one_cpu_path([model])
    return model.eval()


def quantized_modules(model: nn.Module) -> list[str]:
    """Paths of the modules whose weights are stored quantized (what a graft runs whole)."""
    return [name for name, module in model.named_modules() if is_quantized(module)]


def require_quantized(model: nn.Module, what: str, config: Any) -> None:
    """Refuse a model that a quantized load (``config``) left with no quantized module: it would
    run in full precision under a quantized name (torchao leaves GPT-2's ``Conv1D`` as it is)."""
    if quantized_modules(model):
        return
    from transformers.pytorch_utils import Conv1D

    torchao = type(config).__name__ == "TorchAoConfig"
    raise quantizes_nothing(what, torchao and any(isinstance(m, Conv1D) for m in model.modules()))


def spec_config(spec: Any, dtype: torch.dtype) -> Any:
    """The quantization config a :class:`~weightgraft.models.spec.QuantizedSpec` loads with:
    its own config object when the user gave one, else its scheme's."""
    return spec.custom if spec.custom is not None else quantization_config(spec.scheme, dtype)


def quantize_in_memory(model: Any, config: Any, dtype: torch.dtype, device_map: Any,
                       what: str = "a quantized load") -> nn.Module:
    """``model`` (a float model built in memory) quantized by transformers with ``config``:
    saved to a temporary folder and loaded back, as a saved model would load; ``what`` names it
    in the refusal of a load that quantizes nothing."""
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="weightgraft-quantize-") as tmp:
        model.save_pretrained(tmp)
        del model
        loaded = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=config, dtype=dtype, device_map=device_map)
    require_quantized(loaded, what, config)
    one_cpu_path([loaded])
    return loaded.eval()
