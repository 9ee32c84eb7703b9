"""Named spans of a prompt given the way a user writes them: a substring that occurs exactly once
in the prompt, or ``[start, end)`` character offsets. Resolved to character offsets, which the
position selectors then map onto tokens through the tokenizer's offset mapping. A substring
that occurs more than once is refused, never taken at its first occurrence: "in" of "Rory
Culkin stars in" would otherwise land on "Culkin"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from weightgraft.data.errors import SpanError as SpanError

SpanSpec = str | Sequence[int]
MAX_LISTED = 5  # occurrences an ambiguity error names


def occurrences(prompt: str, text: str) -> list[int]:
    """Every start of ``text`` in ``prompt``, overlapping ones included."""
    out, start = [], prompt.find(text)
    while start >= 0:
        out.append(start)
        start = prompt.find(text, start + 1)
    return out


def resolve_span(prompt: str, name: str, spec: SpanSpec) -> tuple[int, int]:
    """``(start, end)`` characters of span ``name`` in ``prompt``."""
    if isinstance(spec, str):
        if not spec:
            raise SpanError(f"span {name!r} is an empty string")
        found = occurrences(prompt, spec)
        if not found:
            raise SpanError(f"span {name!r}: {spec!r} does not occur in the prompt {prompt!r}")
        if len(found) > 1:
            at = ", ".join(f"({s}, {s + len(spec)})" for s in found[:MAX_LISTED])
            more = f" and {len(found) - MAX_LISTED} more" if len(found) > MAX_LISTED else ""
            raise SpanError(f"span {name!r}: {spec!r} occurs {len(found)} times in the prompt, at characters "
                            f"{at}{more}; give the one you mean as (start, end)")
        return found[0], found[0] + len(spec)
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
