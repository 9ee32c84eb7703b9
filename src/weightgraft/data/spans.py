"""Named spans of a prompt given the way a user writes them: a substring of the prompt (its first
occurrence) or ``[start, end)`` character offsets. Resolved to character offsets, which the
position selectors then map onto tokens through the tokenizer's offset mapping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from weightgraft.errors import WeightgraftError

SpanSpec = str | Sequence[int]


class SpanError(WeightgraftError, ValueError):
    """A span that does not lie in its prompt; the message names the span (and the caller adds
    the file and line)."""


def resolve_span(prompt: str, name: str, spec: SpanSpec) -> tuple[int, int]:
    """``(start, end)`` characters of span ``name`` in ``prompt``."""
    if isinstance(spec, str):
        if not spec:
            raise SpanError(f"span {name!r} is an empty string")
        start = prompt.find(spec)
        if start < 0:
            raise SpanError(f"span {name!r}: {spec!r} does not occur in the prompt {prompt!r}")
        return start, start + len(spec)
    if (
        isinstance(spec, Sequence) and len(spec) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in spec)
    ):
        start, end = int(spec[0]), int(spec[1])
        if not 0 <= start < end <= len(prompt):
            raise SpanError(
                f"span {name!r}: [{start}, {end}) is not a non-empty character range of the "
                f"{len(prompt)}-character prompt"
            )
        return start, end
    raise SpanError(f"span {name!r} must be a substring of the prompt or [start, end] characters, got {spec!r}")


def resolve_spans(prompt: str, spans: Mapping[str, SpanSpec] | None) -> dict[str, tuple[int, int]]:
    """Every span of one prompt as character offsets."""
    return {name: resolve_span(prompt, name, spec) for name, spec in (spans or {}).items()}
