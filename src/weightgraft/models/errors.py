"""Errors of model loading: each message names the path and what to do about it."""

from __future__ import annotations

from weightgraft.errors import WeightgraftError


class ModelLoadError(WeightgraftError, RuntimeError):
    """A model could not be loaded. The message names the path and what to do about it."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The spec names nothing that exists locally (file, directory, cached hub id)."""


class PickleRefusedError(ModelLoadError):
    """The checkpoint is a pickle (``.bin``/``.pt``) and ``allow_pickle`` was not given."""


class CorruptCheckpointError(ModelLoadError):
    """A weight file is truncated or unreadable, or the directory lacks a needed file."""
