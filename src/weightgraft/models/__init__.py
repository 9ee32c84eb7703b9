"""Models: typed specs, loading (embedded names, directories, GGUF, hub cache, roles), weight hashes, lean donors."""

from weightgraft.lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "EMBEDDED_MODELS": ("weightgraft.models.embedded", "EMBEDDED_MODELS"),
    "EmbeddedModel": ("weightgraft.models.embedded", "EmbeddedModel"),
    "cache_root": ("weightgraft.models.embedded", "cache_root"),
    "embedded_cache_dir": ("weightgraft.models.embedded", "embedded_cache_dir"),
    "ensure_converted": ("weightgraft.models.embedded", "ensure_converted"),
    "ensure_embedded": ("weightgraft.models.embedded", "ensure_embedded"),
    "CorruptCheckpointError": ("weightgraft.models.errors", "CorruptCheckpointError"),
    "ModelLoadError": ("weightgraft.models.errors", "ModelLoadError"),
    "ModelNotFoundError": ("weightgraft.models.errors", "ModelNotFoundError"),
    "PickleRefusedError": ("weightgraft.models.errors", "PickleRefusedError"),
    "hash_tensor": ("weightgraft.models.hashing", "hash_tensor"),
    "weights_sha256": ("weightgraft.models.hashing", "weights_sha256"),
    "LoadedModel": ("weightgraft.models.loaded", "LoadedModel"),
    "LoadSettings": ("weightgraft.models.loaded", "LoadSettings"),
    "load_role": ("weightgraft.models.donors", "load_role"),
    "ModelSpec": ("weightgraft.models.spec", "ModelSpec"),
    "ModelSpecError": ("weightgraft.models.spec", "ModelSpecError"),
    "parse_spec": ("weightgraft.models.spec", "parse_spec"),
    "load_model": ("weightgraft.models.donors", "load_model"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("weightgraft.models", _EXPORTS, lambda: globals())
