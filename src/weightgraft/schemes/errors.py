"""What the scheme language refuses, in one place: a graft call's inputs
(:class:`GraftInputError`), a rule or scheme built with a field it cannot use
(:class:`SchemeInputError`), a selector that cannot be read or does not fit the model
(:class:`SelectorError`), and a position selector naming a span an example lacks
(:class:`SpanNotFound`)."""

from __future__ import annotations

from weightgraft.errors import WeightgraftError


class GraftInputError(WeightgraftError, ValueError):
    """A call whose inputs cannot be grafted as given (raised before any compute)."""


class SchemeInputError(WeightgraftError, ValueError):
    """A rule or scheme built in Python with a field it cannot use (a misspelt component, an
    unknown key), said in one line."""


class SelectorError(WeightgraftError, ValueError):
    """A selector expression that cannot be parsed or does not fit the model."""


class SpanNotFound(WeightgraftError, LookupError):
    """A position selector names a span this example does not have (the example is excluded).
    ``span`` is the missing span's name when a named span is what is missing."""

    def __init__(self, message: str, span: str | None = None) -> None:
        super().__init__(message)
        self.span = span
