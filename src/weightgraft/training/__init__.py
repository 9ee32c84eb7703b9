"""Finetuning PRE into SFT / task / relation models with the HF Trainer."""

from weightgraft.training.embeddings import freeze_embeddings, untie_embeddings
from weightgraft.training.errors import TrainingError
from weightgraft.training.finetune import finetune
from weightgraft.training.outputs import MANIFEST_NAME, TrainResult
from weightgraft.training.presets import PRESETS, TrainPreset, get_preset
from weightgraft.training.texts import SPLITS, read_split

__all__ = [
    "MANIFEST_NAME",
    "PRESETS",
    "SPLITS",
    "TrainPreset",
    "TrainResult",
    "TrainingError",
    "finetune",
    "freeze_embeddings",
    "get_preset",
    "read_split",
    "untie_embeddings",
]
