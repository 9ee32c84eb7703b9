"""``weightgraft.load``: a model and its tokenizer in one call, for notebooks."""

from __future__ import annotations

import os
import sys
from typing import Any


def load(spec: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for any spec ``weightgraft.models.load_model`` accepts (an
    embedded name such as ``"smollm2-135m"``, ``"demo"`` / ``"demo:pre"`` for what ``weightgraft
    demo`` made, a model directory, a ``.gguf`` file, a cached hub id); ``kwargs`` (``device``,
    ``dtype``, ...) go to ``load_model``. Nothing is downloaded."""
    from weightgraft.models.demo_models import is_demo_spec, resolve_demo_spec
    from weightgraft.models.embedded import EMBEDDED_MODELS
    from weightgraft.models.loading import load_model

    name = os.fspath(spec).strip()
    resolved = resolve_demo_spec(name)  # a demo name without a demo: one line, before loading
    loaded = load_model(resolved, **kwargs)
    if is_demo_spec(name):  # say which model the short name found
        print(f"[weightgraft] {name}: {resolved} (`weightgraft demo`'s "
              f"{'base model' if name.lower() == 'demo:pre' else 'finetune'})", file=sys.stderr, flush=True)
    embedded = EMBEDDED_MODELS.get(resolved.strip().lower())
    if embedded is not None:  # say what the short name stands for
        dtype = next(loaded.model.parameters()).dtype
        print(f"[weightgraft] {embedded.name}: {embedded.description}, dequantized to "
              f"{str(dtype).removeprefix('torch.')}", file=sys.stderr, flush=True)
    return loaded.model, loaded.tokenizer
