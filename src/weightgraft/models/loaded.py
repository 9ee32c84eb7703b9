"""What loading a model gives: the model, its tokenizer, where it came from, its hash."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LoadedModel:
    """A loaded causal LM.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode, on the requested device/dtype.
        tokenizer: its tokenizer. If it had no pad token, ``pad_token`` is set to the EOS token.
            None for ``random:`` models (weightgraft.models.random_models), which have none.
        source: where it came from, e.g. ``"embedded:smollm2-135m (/home/u/.cache/...)"``,
            ``"dir:/abs/path"``, ``"gguf:/abs/file.gguf"`` or ``"hub-cache:org/name"``.
        weights_sha256: :func:`weights_sha256` of the model as loaded (before moving it to
            ``device``; after the dtype conversion).
    """

    model: Any
    tokenizer: Any
    source: str
    weights_sha256: str
