"""Errors of the data package: building or loading relation datasets, reading test prompts,
resolving spans.

A dataset's errors derive from :class:`DataError`, itself a :class:`ValueError`, so callers can
catch one class and print its message: each message names the offending world, template,
field or metadata row. Test prompts that cannot be read are a :class:`DatasetError`, a span that
does not lie in its prompt a :class:`SpanError` (both :class:`ValueError` too).
"""

from __future__ import annotations

from weightgraft.errors import WeightgraftError


class DataError(WeightgraftError, ValueError):
    """Base class for all dataset errors."""


class UnknownWorldError(DataError):
    """The requested world is neither built in nor given as custom metadata + templates."""


class TemplateError(DataError):
    """A template file or template string is malformed."""


class TemplateFieldError(TemplateError):
    """A template names a field that the metadata does not have."""

    def __init__(self, field: str, template: str, source: str | None = None) -> None:
        self.field = field
        self.template = template
        self.source = source
        where = f" in {source}" if source else ""
        super().__init__(
            f"template '{template}'{where} uses field '{field}', "
            f"but the metadata has no field '{field}'"
        )


class MetadataRowError(DataError):
    """A metadata row is malformed (bad JSON, missing or empty required field, ...)."""

    def __init__(self, row: int, message: str, row_id: str | None = None) -> None:
        self.row = row
        self.row_id = row_id
        ident = f" (id {row_id!r})" if row_id is not None else ""
        super().__init__(f"metadata row {row}{ident}: {message}")


class NotEnoughDataError(DataError):
    """More relations were requested than the world's source data can supply."""


class AmbiguousPromptError(DataError):
    """A test prompt would have more than one correct answer."""


class DatasetError(WeightgraftError, ValueError):
    """Test prompts that cannot be read or are empty."""


class SpanError(WeightgraftError, ValueError):
    """A span that does not lie in its prompt; the message names the span (and the caller adds
    the file and line)."""
