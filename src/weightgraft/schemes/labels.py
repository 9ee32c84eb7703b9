"""Position labels: one name per token of a prompt, and every such name is also a position
selector that picks that very token, so that a cell of ``localize`` (named by its label), a row
of ``wg.tokens`` and a rule's ``positions`` always mean the same place.

A span's name (``actor``, ``relation``, ``first_entity`` = the earliest entity span) is the whole
span. A span's last token is ``{span}_last`` (``first_entity_last``); ``{span}_last-k`` is the
k-th token before it, inside the span; ``{span}_last+k`` the k-th token after it (the template's
words that follow); ``tok{i}`` a token before any span; ``last`` the prompt's last token. Counted
from the span's last token, the labels line up across prompts of one template whose entities
differ in length.

Labels of version 1 (before ``LABEL_VERSION`` 2) named a span's last token by the span itself
(``first_entity``, ``first_entity-2``, ``relation+1``), which as a selector is the whole span;
``upgrade_label`` reads them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from weightgraft.schemes.errors import SpanNotFound as SpanNotFound

LITERAL_SPANS = frozenset({"relation", "relation_preposition", "preposition"})
FIRST_ENTITY = "first_entity"
LAST = "_last"
LABEL_VERSION = 2  # stored with localize runs: cells named by version-1 labels are never mixed in
LABEL_ATOM = r"[A-Za-z_]\w*_last[+-]\d+"  # a label with an offset, one atom of a position selector
_OFFSET = re.compile(r"(?P<base>[A-Za-z_]\w*?)_last(?:(?P<sign>[+-])(?P<k>\d+))?")
_TOK = re.compile(r"tok(\d+)")


def token_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """Token indices whose characters overlap ``[start, end)`` (special tokens have none)."""
    return [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]


def first_entity(spans: Mapping[str, tuple[int, int]], answer_field: str | None) -> str | None:
    """The earliest field span of the prompt that is an entity (not a literal relation word)."""
    fields = [(s[0], k) for k, s in spans.items() if k not in LITERAL_SPANS and k != answer_field]
    return min(fields)[1] if fields else None


def span_tokens(name: str, offsets: Sequence[tuple[int, int]], spans: Mapping[str, tuple[int, int]],
                answer_field: str | None = None) -> list[int]:
    """The tokens of span ``name`` (``first_entity``: the earliest entity span, whatever its field)."""
    if name not in spans and name == FIRST_ENTITY:
        found = first_entity(spans, answer_field)
        if found is None:
            # no ``span``: the example is excluded (a scheme is skipped only for a span its template never has)
            raise SpanNotFound("the prompt has no entity span for 'first_entity'")
        name = found
    if name not in spans:
        raise SpanNotFound(f"span {name!r} is not marked in this prompt (has: {sorted(spans)})", name)
    start, end = spans[name]
    toks = token_span(offsets, start, end)
    if not toks:
        raise SpanNotFound(f"span {name!r} [{start}, {end}) covers no token")
    return toks


def label_span(name: str) -> str | None:
    """The span a label-shaped name counts from (``relation_last+1`` -> ``relation``); None for
    ``tok{i}`` (a plain index) and for a name that is not a label."""
    if _TOK.fullmatch(name):
        return None
    m = _OFFSET.fullmatch(name)
    return m.group("base") if m else None


def is_label(name: str) -> bool:
    """``tok{i}`` or ``{span}_last[+-k]``: a name that picks one token."""
    return bool(_TOK.fullmatch(name) or _OFFSET.fullmatch(name))


def label_position(name: str, offsets: Sequence[tuple[int, int]], spans: Mapping[str, tuple[int, int]],
                   answer_field: str | None = None) -> int:
    """The one token a label picks; ``SpanNotFound`` where this prompt has no such token
    (``first_entity_last-3`` in a two-token name, ``tok9`` in a 5-token prompt)."""
    n = len(offsets)
    if m := _TOK.fullmatch(name):
        if int(m.group(1)) >= n:
            raise SpanNotFound(f"{name}: the prompt has {n} tokens")
        return int(m.group(1))
    m = _OFFSET.fullmatch(name)
    if m is None:
        raise SpanNotFound(f"{name!r} is neither a span nor a position label")
    toks = span_tokens(m.group("base"), offsets, spans, answer_field)
    k = int(m.group("k") or 0)
    if m.group("sign") == "-":
        if k >= len(toks):
            raise SpanNotFound(f"{name}: span {m.group('base')!r} has {len(toks)} token(s) in this prompt")
        return toks[-1 - k]
    if toks[-1] + k >= n:
        raise SpanNotFound(f"{name}: the prompt ends {n - 1 - toks[-1]} token(s) after span {m.group('base')!r}")
    return toks[-1] + k


def position_labels(offsets: Sequence[tuple[int, int]], spans: Mapping[str, tuple[int, int]],
                    answer_field: str | None = None) -> list[str]:
    """One label per position (see the module's docstring); each picks its own position as a
    selector. The first entity span goes by ``first_entity``, not its field's name."""
    n = len(offsets)
    fe = first_entity(spans, answer_field)
    owner: dict[int, tuple[str, int]] = {}
    for name, (start, end) in spans.items():
        toks = token_span(offsets, start, end)
        shown = (FIRST_ENTITY if name == fe else name) + LAST
        for k, i in enumerate(reversed(toks)):
            owner.setdefault(i, (shown, k))
    labels, last_span, since = [], None, 0
    for i in range(n):
        if i in owner:
            name, k = owner[i]
            labels.append(name if k == 0 else f"{name}-{k}")
            if k == 0:
                last_span, since = name, 0
        elif last_span is not None:
            since += 1
            labels.append(f"{last_span}+{since}")
        else:
            labels.append(f"tok{i}")
    labels[-1] = "last"
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # overlapping spans could repeat a label: keep them apart
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label}#{seen[label]}"
    return labels


def label_group(label: str) -> tuple[str, bool]:
    """``(span, after)`` of a label of either version: ``first_entity_last-2`` and the old
    ``first_entity-2`` -> ``("first_entity", False)``; ``relation_last+1`` / ``relation+1`` ->
    ``("relation", True)``; ``tok3`` -> ``("other", False)``; a repeat's ``#2`` dropped."""
    label = re.sub(r"#\d+$", "", label)
    if _TOK.fullmatch(label):
        return "other", False
    m = re.fullmatch(r"(?P<base>.+?)(?:_last)?(?:(?P<sign>[-+])\d+)?", label)
    assert m is not None  # the pattern matches any non-empty label
    return m.group("base"), m.group("sign") == "+"


def upgrade_label(label: str) -> str:
    """A version-1 label as version 2 names the same token: ``first_entity`` ->
    ``first_entity_last``, ``relation+1`` -> ``relation_last+1``; ``tok{i}``, ``last`` and a label
    already of version 2 kept."""
    m = re.fullmatch(r"(?P<base>.+?)(?P<offset>[-+]\d+)?(?P<repeat>#\d+)?", label)
    if m is None or m.group("base") == "last" or _TOK.fullmatch(m.group("base")) or m.group("base").endswith(LAST):
        return label
    return f"{m.group('base')}{LAST}{m.group('offset') or ''}{m.group('repeat') or ''}"


def upgrade_cells(obj: object) -> object:
    """A stored localize artifact (search.json) with every cell's version-1 label upgraded:
    ``position_label`` values, and ``[label, slot]`` pairs under ``cells``."""
    if isinstance(obj, dict):
        out: dict[object, object] = {}
        for key, value in obj.items():
            if key == "position_label" and isinstance(value, str):
                out[key] = upgrade_label(value)
            elif key == "cells" and isinstance(value, list):
                out[key] = [[upgrade_label(c[0]), c[1]] if isinstance(c, (list, tuple)) and len(c) == 2
                            and isinstance(c[0], str) else upgrade_cells(c) for c in value]
            else:
                out[key] = upgrade_cells(value)
        return out
    if isinstance(obj, list):
        return [upgrade_cells(x) for x in obj]
    return obj
