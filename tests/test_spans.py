"""Spans written as substrings or character ranges resolve to character offsets, or fail
naming the span."""

from __future__ import annotations

import pytest

from weightgraft.data.spans import SpanError, resolve_spans

PROMPT = "The Eiffel Tower is in the city of"


def test_substring_is_its_first_occurrence():
    spans = resolve_spans(PROMPT, {"subject": "Eiffel Tower", "article": "the"})
    assert spans == {"subject": (4, 16), "article": (23, 26)}
    assert PROMPT[slice(*spans["subject"])] == "Eiffel Tower"


def test_character_range_is_kept():
    assert resolve_spans(PROMPT, {"subject": [4, 16]}) == {"subject": (4, 16)}


@pytest.mark.parametrize("spec", ["Louvre", "", [10, 5], [0, 99], [1.0, 3.0], [True, 3], "x y z"])
def test_bad_spans_name_the_span(spec):
    with pytest.raises(SpanError, match="subject"):
        resolve_spans(PROMPT, {"subject": spec})
