"""Models: loading (embedded names, directories, GGUF, hub cache), weight hashes, lean donors."""

from weightgraft.models.embedded import (
    EMBEDDED_MODELS,
    EmbeddedModel,
    cache_root,
    embedded_cache_dir,
    ensure_converted,
    ensure_embedded,
)
from weightgraft.models.errors import (
    CorruptCheckpointError,
    ModelLoadError,
    ModelNotFoundError,
    PickleRefusedError,
)
from weightgraft.models.hashing import hash_tensor, weights_sha256
from weightgraft.models.loading import (
    LoadedModel,
    load_lean_donor,
    load_model,
    safetensors_dir,
)

__all__ = [
    "EMBEDDED_MODELS",
    "CorruptCheckpointError",
    "EmbeddedModel",
    "LoadedModel",
    "ModelLoadError",
    "ModelNotFoundError",
    "PickleRefusedError",
    "cache_root",
    "embedded_cache_dir",
    "ensure_converted",
    "ensure_embedded",
    "hash_tensor",
    "load_lean_donor",
    "load_model",
    "safetensors_dir",
    "weights_sha256",
]
