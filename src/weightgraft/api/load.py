"""``weightgraft.load``: a model and its tokenizer in one call, for notebooks."""

from __future__ import annotations

import os
import sys
from typing import Any


def load(spec: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for any spec ``weightgraft.models.load_model`` accepts (an
    embedded name such as ``"smollm2-135m"``, a model directory, a ``.gguf`` file, a cached hub
    id); ``kwargs`` (``device``, ``dtype``, ...) go to ``load_model``. Nothing is downloaded."""
    from weightgraft.models.embedded import EMBEDDED_MODELS
    from weightgraft.models.loading import load_model

    loaded = load_model(spec, **kwargs)
    embedded = EMBEDDED_MODELS.get(os.fspath(spec).strip().lower())
    if embedded is not None:  # say what the short name stands for
        dtype = next(loaded.model.parameters()).dtype
        print(f"[weightgraft] {embedded.name}: {embedded.description}, dequantized to "
              f"{str(dtype).removeprefix('torch.')}", file=sys.stderr, flush=True)
    return loaded.model, loaded.tokenizer
