"""The root of weightgraft's errors, the engine's (its floor has no other error module) and a
results folder's.

Every error the project raises for input it cannot use (a config, a path, a model, a prompt)
derives from :class:`WeightgraftError`, and keeps its built-in base (``ValueError``,
``OSError``, ...) so that callers catching those still catch it. The CLI prints such an error as
one line; anything else is a bug in weightgraft and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class WeightgraftError(Exception):
    """An error whose message tells the user what to change; never a bug in weightgraft."""


class GraftArgumentError(WeightgraftError, ValueError):
    """An argument the engine cannot use (a map's shape or range, a name that is not a slot, a
    count, a metric's missing input): the caller's to change, named in one line."""


class GraftArgumentTypeError(GraftArgumentError, TypeError):
    """An argument of the wrong kind (a float map where model indices go, integers where
    shares go, a module the engine cannot graft this way); a ``TypeError`` as well."""


class UnsupportedArchitectureError(WeightgraftError, ValueError):
    """The model's architecture (or one of its config options) is not covered by an adapter."""


class UnsupportedProjection(WeightgraftError, TypeError):
    """A module that is neither ``nn.Linear`` nor ``Conv1D`` where one of them is needed."""


class UnsupportedLora(WeightgraftError, ValueError):
    """A peft layer whose computation the engine does not reproduce (DoRA, LoRA biases, ...)."""


class ModelMismatchError(WeightgraftError, ValueError):
    """Models that were asked to be grafted together do not match."""


class ResultsDirConflict(WeightgraftError, ValueError):
    """A results folder that holds results of another config (a run, a localize run, a stage):
    refused, never mixed."""


class ResultsWriteError(WeightgraftError, OSError):
    """Results could not be written (disk full, permissions); earlier results are intact."""


def validation_line(exc: Exception, loc: Callable[[tuple[Any, ...]], str] | None = None, at: str = "") -> str:
    """pydantic's ``ValidationError`` as one line a user can act on: ``field.path: message``
    per error, joined by ``; `` (pydantic's own text spans lines and ends in a web link). ``loc``
    writes a field path (default: its parts joined by dots); ``at`` goes before each path (a
    config's ``at schemes.0.layers: ...``)."""
    parts = []
    for err in exc.errors():  # type: ignore[attr-defined]
        where = loc(tuple(err["loc"])) if loc is not None else ".".join(str(x) for x in err["loc"])
        msg = " ".join(str(err["msg"]).removeprefix("Value error, ").split())
        parts.append(f"{at}{where or '<root>'}: {msg}")
    return "; ".join(parts)
