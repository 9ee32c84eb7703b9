"""Spans written as substrings or character ranges resolve to character offsets, or fail
naming the span."""

from __future__ import annotations

import pytest

from weightgraft.data.spans import SpanError, resolve_spans

PROMPT = "The Eiffel Tower is in the city of"


def test_a_substring_that_occurs_once_is_its_place():
    spans = resolve_spans(PROMPT, {"subject": "Eiffel Tower", "article": "the"})
    assert spans == {"subject": (4, 16), "article": (23, 26)}
    assert PROMPT[slice(*spans["subject"])] == "Eiffel Tower"


@pytest.mark.parametrize("prompt,text,at", [
    ("Rory Culkin stars in in a movie alongside", "in", "(9, 11), (18, 20), (21, 23)"),
    ("aaa", "aa", "(0, 2), (1, 3)"),  # overlapping occurrences count too
    ("The Eiffel Tower is in the city of", "e", "(2, 3), (8, 9), (14, 15), (25, 26)"),
    ("a a a a a a a", "a", "(0, 1), (2, 3), (4, 5), (6, 7), (8, 9) and 2 more"),
])
def test_a_substring_that_occurs_more_than_once_is_refused(prompt, text, at):
    with pytest.raises(SpanError) as info:
        resolve_spans(prompt, {"relation_preposition": text})
    message = str(info.value)
    assert "relation_preposition" in message and at in message and "(start, end)" in message
    assert "\n" not in message
    # the offsets form picks any one of them
    start, end = (int(x) for x in at.split(" and ")[0].split("), (")[-1].strip("()").split(", "))
    assert resolve_spans(prompt, {"relation_preposition": [start, end]}) == {"relation_preposition": (start, end)}


def test_character_range_is_kept():
    assert resolve_spans(PROMPT, {"subject": [4, 16]}) == {"subject": (4, 16)}


@pytest.mark.parametrize("spec", ["Louvre", "", [10, 5], [0, 99], [1.0, 3.0], [True, 3], "x y z"])
def test_bad_spans_name_the_span(spec):
    with pytest.raises(SpanError, match="subject"):
        resolve_spans(PROMPT, {"subject": spec})
