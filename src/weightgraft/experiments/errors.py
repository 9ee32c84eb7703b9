"""Errors of a sweep's run that its config could not foresee: a row too large for the device,
a quantized role that answers otherwise than its unquantized model. (A config's own errors are
``weightgraft.configfile.ConfigError``; a results folder's are in ``weightgraft.errors``.)"""

from __future__ import annotations

from weightgraft.errors import WeightgraftError

__all__ = ["OutOfMemory", "QuantizedDisagreement"]


class OutOfMemory(WeightgraftError, RuntimeError):
    """One row alone does not fit in the device's memory."""


class QuantizedDisagreement(WeightgraftError, ValueError):
    """A quantized role whose answers differ from its unquantized model's beyond the stated bounds."""
