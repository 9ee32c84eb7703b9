"""``weightgraft.load``: a model and its tokenizer in one call, for notebooks."""

from __future__ import annotations

import os
from typing import Any


def load(spec: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for any spec ``weightgraft.models.load_model`` accepts (an
    embedded name such as ``"smollm2-135m"``, a model directory, a ``.gguf`` file, a cached hub
    id); ``kwargs`` (``device``, ``dtype``, ...) go to ``load_model``. Nothing is downloaded."""
    from weightgraft.models.loading import load_model

    loaded = load_model(spec, **kwargs)
    return loaded.model, loaded.tokenizer
