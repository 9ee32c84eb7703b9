"""``weightgraft.load``: a model and its tokenizer in one call, for notebooks."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from weightgraft.models.spec import ModelSpec

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase
    from transformers.utils.quantization_config import QuantizationConfigMixin


def load(spec: str | os.PathLike[str] | ModelSpec, *, quantization: str | QuantizationConfigMixin | None = None,
         **kwargs: Any) -> tuple[nn.Module, PreTrainedTokenizerBase | None]:
    """``(model, tokenizer)`` for any spec ``weightgraft.models.load_model`` accepts (an
    embedded name such as ``"smollm2-135m"``, ``"demo"`` / ``"demo:pre"`` for what ``weightgraft
    demo`` made, a model directory, a ``.gguf`` file, a cached hub id, ``quantized(SPEC, nf4)``);
    ``quantization``: load it quantized, a scheme name (``"nf4"``, ``"fp4"``, ``"int8"``,
    ``"torchao-int8"``) or a transformers quantization config of your own (the same as the spec
    ``quantized(SPEC, SCHEME)``); ``kwargs`` (``device``, ``dtype``, ...) go to ``load_model``.
    Nothing is downloaded."""
    from weightgraft.models.donors import LoadSettings, load_role
    from weightgraft.models.loading import resolved_spec
    from weightgraft.models.spec import DemoSpec, EmbeddedSpec, QuantizedSpec, parse_spec, quantized

    parsed = parse_spec(spec)
    if quantization is not None:
        parsed = quantized(parsed, quantization)
    if isinstance(parsed, QuantizedSpec):
        from weightgraft.models.loading import check_model_spec

        check_model_spec(parsed)  # the scheme's package and the model exist: one line before loading
    resolved = resolved_spec(parsed)  # a demo name without a demo: one line, before loading
    loaded = load_role(resolved, LoadSettings(**kwargs))
    if isinstance(parsed, DemoSpec):  # say which model the short name found
        print(f"[weightgraft] {parsed.text.strip()}: {resolved.text} (`weightgraft demo`'s "
              f"{'base model' if parsed.role == 'pre' else 'finetune'})", file=sys.stderr, flush=True)
    if isinstance(resolved, EmbeddedSpec):  # say what the short name stands for
        from weightgraft.models.embedded import EMBEDDED_MODELS

        embedded = EMBEDDED_MODELS[resolved.name]
        dtype = next(loaded.model.parameters()).dtype
        print(f"[weightgraft] {embedded.name}: {embedded.description}, dequantized to "
              f"{str(dtype).removeprefix('torch.')}", file=sys.stderr, flush=True)
    return loaded.model, loaded.tokenizer
