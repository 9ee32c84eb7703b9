"""``weightgraft.tokens``: a prompt's tokens with the labels positions go by, so that a
selector such as ``first_entity-3`` or ``relation+2`` can be read off before running."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from weightgraft.data.spans import SpanError, SpanSpec, resolve_spans
from weightgraft.localization.examples import position_labels
from weightgraft.schemes.binding import GraftInputError, check_tokenizer
from weightgraft.schemes.selectors import first_entity, token_span


def tokens(tokenizer: Any, prompt: str, spans: Mapping[str, SpanSpec] | None = None) -> pd.DataFrame:
    """One row per token of ``prompt`` (as ``wg.graft`` tokenizes it): ``position``, ``id``,
    ``token`` (its text), ``start`` / ``end`` (characters), ``label`` (``last``, ``{span}`` for a
    span's last token, ``{span}-k`` inside it, ``{span}+k`` after it, ``tok{i}`` before any span;
    the first entity span is ``first_entity``: one label per position, as the cells of
    ``localize``'s maps are named) and ``spans`` (the named spans it belongs to: a span name as a
    position selector, ``positions="first_entity"``, selects every token listed under it)."""
    check_tokenizer(tokenizer)
    try:
        char_spans = resolve_spans(prompt, spans)
    except SpanError as exc:
        raise GraftInputError(f"prompt {prompt!r}: {exc}") from exc
    enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    if not ids:
        raise GraftInputError(f"prompt {prompt!r} tokenizes to nothing")
    owners: dict[int, list[str]] = {}
    fe = first_entity(char_spans, None)
    for name, (start, end) in char_spans.items():
        for i in token_span(offsets, start, end):
            owners.setdefault(i, []).append(name + (" (first_entity)" if name == fe else ""))
    labels = position_labels(offsets, char_spans)
    return pd.DataFrame({
        "position": range(len(ids)), "id": ids,
        "token": [tokenizer.decode([i]) for i in ids],
        "start": [s for s, _ in offsets], "end": [e for _, e in offsets],
        "label": labels, "spans": [", ".join(owners.get(i, [])) for i in range(len(ids))],
    })
