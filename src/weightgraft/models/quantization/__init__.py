"""Models loaded quantized, the way users load them: transformers' ``from_pretrained`` with a
``quantization_config`` (bitsandbytes nf4 / fp4 / int8, torchao int8 weight-only).

The engine grafts a quantized module whole (each row group through its own model's quantized
module); nothing here dequantizes. A package rather than modules of ``models/`` only because
``models/`` holds the folder limit of modules (tests/project/test_architecture.py). Its names import on
first use: a spec's scheme is checked (``schemes``) without importing torch.
"""

from weightgraft.lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "QUANTIZATIONS": ("weightgraft.models.quantization.schemes", "QUANTIZATIONS"),
    "REFUSED": ("weightgraft.models.quantization.schemes", "REFUSED"),
    "QuantizationError": ("weightgraft.models.quantization.schemes", "QuantizationError"),
    "quantization_config": ("weightgraft.models.quantization.load", "quantization_config"),
    "load_quantized": ("weightgraft.models.quantization.load", "load_quantized"),
    "load_quantized_role": ("weightgraft.models.quantization.load", "load_quantized_role"),
    "quantized_modules": ("weightgraft.models.quantization.load", "quantized_modules"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("weightgraft.models.quantization", _EXPORTS, lambda: globals())
