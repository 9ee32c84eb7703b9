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
    from weightgraft.models.spec import parse_spec, quantized

    parsed = parse_spec(spec)
    if quantization is not None:
        parsed = quantized(parsed, quantization)
    if parsed.scheme is not None:
        parsed.check()  # the scheme's package and the model exist: one line before loading
    resolved = parsed.resolved()  # a demo name without a demo: one line, before loading
    loaded = load_role(resolved, LoadSettings(**kwargs))
    for note in (parsed.loaded_note(loaded), resolved.loaded_note(loaded) if resolved is not parsed else None):
        if note is not None:  # say what a short name stood for
            print(f"[weightgraft] {note}", file=sys.stderr, flush=True)
    return loaded.model, loaded.tokenizer
