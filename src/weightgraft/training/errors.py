"""Training errors."""

from __future__ import annotations

from weightgraft.errors import WeightgraftError


class TrainingError(WeightgraftError, ValueError):
    """Bad training input (data directory, split, preset, output directory). The message says
    what is wrong and how to fix it."""
