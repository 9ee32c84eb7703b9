"""The quantization schemes a role can load in, by name: which package each needs and which
are refused here (why, in one line). No heavy import: a spec's scheme is checked where the
spec is read, before anything loads."""

from __future__ import annotations

import importlib.util

from weightgraft.models.errors import QuantizationError as QuantizationError

__all__ = ["QUANTIZATIONS", "REFUSED", "QuantizationError", "check_scheme", "check_installed", "quantizes_nothing"]

# Schemes that load and graft on a CPU (bitsandbytes >= 0.45 has CPU kernels) and on a GPU.
QUANTIZATIONS: tuple[str, ...] = ("nf4", "fp4", "int8", "torchao-int8")
# Names users ask for that this build refuses, with why (one line each).
REFUSED: dict[str, str] = {
    "torchao-int4": "torchao-int4 is refused: torchao's int4 weight-only layouts need its mslk CUDA "
                    "kernels (no CPU path in torchao 0.18); use nf4 or fp4 (bitsandbytes 4-bit) or torchao-int8",
}
PACKAGE = {"nf4": "bitsandbytes", "fp4": "bitsandbytes", "int8": "bitsandbytes", "torchao-int8": "torchao"}


def check_scheme(scheme: str) -> None:
    """A scheme this build knows and does not refuse (the name only; see :func:`check_installed`)."""
    if scheme in REFUSED:
        raise QuantizationError(REFUSED[scheme])
    if scheme not in QUANTIZATIONS:
        raise QuantizationError(f"unknown quantization {scheme!r}; choose one of {', '.join(QUANTIZATIONS)}")


def check_installed(scheme: str) -> None:
    """The package ``scheme`` needs is installed (one line naming the extra when it is not)."""
    check_scheme(scheme)
    package = PACKAGE[scheme]
    if importlib.util.find_spec(package) is None:
        raise QuantizationError(f"quantization {scheme!r} needs {package}: pip install 'weightgraft[quant]'")


def quantizes_nothing(what: str, conv1d: bool) -> QuantizationError:
    """The refusal of a quantized role in which no module is (or would be) quantized: it would run
    in full precision while every record calls it quantized. ``conv1d``: the cause is torchao,
    which converts ``nn.Linear`` only, on a model whose projections are transformers' ``Conv1D``."""
    if conv1d:
        return QuantizationError(
            f"{what}: no module would be quantized (it would run unquantized): torchao's int8 weight-only converts "
            "nn.Linear only and this model's projections are transformers' Conv1D, as GPT-2's; use nf4, fp4 or int8, "
            "which convert Conv1D")
    return QuantizationError(f"{what}: no module would be quantized (it would run unquantized): every module the "
                             "scheme converts is kept unquantized (modules_to_not_convert / llm_int8_skip_modules)")
