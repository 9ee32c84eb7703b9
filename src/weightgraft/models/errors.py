"""Errors of the models floor: loading (each message names the path and what to do about it),
model specs, PEFT and low-rank donors, quantization, tokenizers."""

from __future__ import annotations

from weightgraft.errors import WeightgraftError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")  # checkpoints that unpickle (refused unless allowed)


class ModelLoadError(WeightgraftError, RuntimeError):
    """A model could not be loaded. The message names the path and what to do about it."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The spec names nothing that exists locally (file, directory, cached hub id)."""


class PickleRefusedError(ModelLoadError):
    """The checkpoint is a pickle (``.bin``/``.pt``) and ``allow_pickle`` was not given."""


class CorruptCheckpointError(ModelLoadError):
    """A weight file is truncated or unreadable, or the directory lacks a needed file."""


class ModelSpecError(WeightgraftError, ValueError):
    """A model spec that cannot be read (one line, naming the spec and how to write it)."""


class PeftError(WeightgraftError, ValueError):
    """A peft role spec or adapter directory that cannot make a LoRA donor."""


class LowRankError(WeightgraftError, ValueError):
    """A low-rank spec or model pair that cannot make a low-rank donor."""


class PeftSpecError(ModelSpecError, PeftError):
    """A malformed ``peft(...)`` spec."""


class LowRankSpecError(ModelSpecError, LowRankError):
    """A malformed ``lowrank(...)`` spec."""


class RandomSpecError(ModelSpecError, ModelNotFoundError):
    """A ``random:`` spec that names no config."""


class TokenizerMismatchError(WeightgraftError, ValueError):
    """Two models of a graft set do not share a tokenizer."""


class DemoNotFoundError(ModelNotFoundError):
    """``demo`` was named but no demo has run here (or its finetune is gone from the cache)."""


class QuantizationError(WeightgraftError, ValueError):
    """A quantization scheme that is unknown, refused, or whose package is not installed."""


class QuantizedSpecError(ModelSpecError, QuantizationError):
    """A malformed ``quantized(...)`` spec, or one naming an unknown or refused scheme."""
