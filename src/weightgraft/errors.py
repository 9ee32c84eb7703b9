"""The root of weightgraft's errors.

Every error the project raises for input it cannot use (a config, a path, a model, a prompt)
derives from :class:`WeightgraftError`, and keeps its built-in base (``ValueError``,
``OSError``, ...) so that callers catching those still catch it. The CLI prints such an error as
one line; anything else is a bug in weightgraft and keeps its traceback.
"""

from __future__ import annotations


class WeightgraftError(Exception):
    """An error whose message tells the user what to change; never a bug in weightgraft."""


class GraftArgumentError(WeightgraftError, ValueError):
    """An argument the engine cannot use (a map's shape or range, a name that is not a slot, a
    count, a metric's missing input): the caller's to change, named in one line."""


class GraftArgumentTypeError(GraftArgumentError, TypeError):
    """An argument of the wrong kind (a float map where model indices go, integers where
    shares go, a module the engine cannot graft this way); a ``TypeError`` as well."""
