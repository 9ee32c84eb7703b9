"""``weightgraft.tokens``: a prompt's tokens with the labels positions go by, so that a
selector such as ``first_entity_last-2`` or ``relation_last+1`` can be read off before running."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pandas as pd

from weightgraft.data.spans import SpanError, SpanSpec, resolve_spans
from weightgraft.schemes.binding import GraftInputError, check_tokenizer
from weightgraft.schemes.labels import FIRST_ENTITY, first_entity, position_labels, token_span



if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from transformers import PreTrainedTokenizerBase

def tokens(tokenizer: PreTrainedTokenizerBase, prompt: str, spans: Mapping[str, SpanSpec] | None = None) -> pd.DataFrame:
    """One row per token of ``prompt`` (as ``wg.graft`` tokenizes it): ``position``, ``id``,
    ``token`` (its text), ``start`` / ``end`` (characters), ``label`` and ``spans``. Both are
    position selectors that pick what the row shows, so a rule can be written from this table:
    ``label`` picks this one token (``first_entity_last`` for the first entity's last token,
    ``first_entity_last-k`` inside it, ``relation_last+k`` after a span, ``tok{i}`` before any
    span, ``last``; the names of ``localize``'s cells); each name in ``spans`` (``actor``,
    ``first_entity``) picks every token listed under it."""
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
            owners.setdefault(i, []).extend([name, FIRST_ENTITY] if name == fe else [name])
    labels = position_labels(offsets, char_spans)
    return pd.DataFrame({
        "position": range(len(ids)), "id": ids,
        "token": [tokenizer.decode([i]) for i in ids],
        "start": [s for s, _ in offsets], "end": [e for _, e in offsets],
        "label": labels, "spans": [", ".join(owners.get(i, [])) for i in range(len(ids))],
    })
