"""Finetuning PRE into SFT / task / relation models with the HF Trainer."""

from weightgraft.lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "freeze_embeddings": ("weightgraft.training.embeddings", "freeze_embeddings"),
    "untie_embeddings": ("weightgraft.training.embeddings", "untie_embeddings"),
    "TrainingError": ("weightgraft.training.errors", "TrainingError"),
    "finetune": ("weightgraft.training.trainer", "finetune"),
    "MANIFEST_NAME": ("weightgraft.training.outputs", "MANIFEST_NAME"),
    "TrainResult": ("weightgraft.training.outputs", "TrainResult"),
    "PRESETS": ("weightgraft.training.presets", "PRESETS"),
    "TrainPreset": ("weightgraft.training.presets", "TrainPreset"),
    "get_preset": ("weightgraft.training.presets", "get_preset"),
    "SPLITS": ("weightgraft.training.texts", "SPLITS"),
    "read_split": ("weightgraft.training.texts", "read_split"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("weightgraft.training", _EXPORTS, lambda: globals())
