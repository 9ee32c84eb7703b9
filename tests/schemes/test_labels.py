"""Position labels (``schemes.labels``): each label picks its own token as a selector, and the
labels stored by earlier localize runs are read under today's names."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from weightgraft.schemes.labels import label_group, position_labels, upgrade_cells, upgrade_label
from weightgraft.schemes.selectors import SelectorError, SpanNotFound, position_names, select_positions

# "<s>AB CD EF starred in it": BOS, a 3-token entity, a 2-token relation, one word after it
OFFSETS = [(0, 0), (0, 2), (3, 5), (6, 8), (9, 16), (17, 19), (20, 22)]
SPANS = {"actor": (0, 8), "relation": (9, 19)}


def test_every_label_selects_its_own_token_and_span_names_the_whole_span():
    labels = position_labels(OFFSETS, SPANS)
    assert labels == ["tok0", "first_entity_last-2", "first_entity_last-1", "first_entity_last",
                      "relation_last-1", "relation_last", "last"]
    for i, label in enumerate(labels):
        assert select_positions(label, OFFSETS, SPANS) == [i], label
    assert select_positions("first_entity", OFFSETS, SPANS) == select_positions("actor", OFFSETS, SPANS) == [1, 2, 3]
    assert select_positions("relation_last+1", OFFSETS, SPANS) == [6]
    # an offset is part of the label; a union with a token index takes spaces or parentheses
    assert select_positions("relation_last + 1", OFFSETS, SPANS) == [1, 5]
    assert select_positions("relation+1", OFFSETS, SPANS) == [1, 4, 5]  # a span name: unchanged
    assert select_positions("~first_entity & ~last", OFFSETS, SPANS) == [0, 4, 5]


@pytest.mark.parametrize("expr, match", [
    ("first_entity_last-3", "has 3 token"), ("relation_last+2", "ends 1 token"), ("tok9", "7 tokens"),
    ("movie_last", "not marked"),
])
def test_a_label_this_prompt_lacks_is_span_not_found(expr, match):
    with pytest.raises(SpanNotFound, match=match):
        select_positions(expr, OFFSETS, SPANS)


def test_position_names_count_a_label_from_its_span():
    assert position_names("first_entity_last-2 + relation_last+1 + tok0 + last") == {"first_entity", "relation", "last"}
    with pytest.raises(SelectorError):
        select_positions("first_entity_last-", OFFSETS, SPANS)


def test_labels_of_either_version_group_and_upgrade_the_same_way():
    old = ["tok0", "first_entity-2", "first_entity", "first_entity+1", "relation", "relation#2", "last"]
    new = ["tok0", "first_entity_last-2", "first_entity_last", "first_entity_last+1", "relation_last",
           "relation_last#2", "last"]
    assert [upgrade_label(x) for x in old] == new
    assert [upgrade_label(x) for x in new] == new  # already current: kept
    assert [label_group(x) for x in old] == [label_group(x) for x in new]
    stored = {"searches": [{"cells": [{"position_label": "first_entity", "slot": "layers.0.o"}, ["relation+1", "embed"]],
                            "controls": {"random": [{"cells": [["last", "unembed"]]}]}}]}
    got = upgrade_cells(stored)
    assert got["searches"][0]["cells"] == [{"position_label": "first_entity_last", "slot": "layers.0.o"},
                                           ["relation_last+1", "embed"]]
    assert got["searches"][0]["controls"]["random"][0]["cells"] == [["last", "unembed"]]


def test_explore_reads_an_old_localize_run_under_todays_labels(tmp_path):
    from weightgraft.explore.artifacts import LocalizeView

    cells = pd.DataFrame({"example_id": ["a", "a"], "template": ["t", "t"], "direction": ["sufficiency"] * 2,
                          "position": [3, 6], "position_label": ["first_entity", "last"],
                          "slot": ["layers.0.o", "unembed"], "estimate": [0.5, 0.25]})
    cells.to_parquet(tmp_path / "cells.parquet")
    (tmp_path / "search.json").write_text(json.dumps({"searches": [
        {"direction": "sufficiency", "template": "t", "cells": [{"position_label": "first_entity-1", "slot": "embed"}]}]}))
    view = LocalizeView(tmp_path)
    assert {label for label, _, _ in view.maps[0]["values"]["estimate"]} == {"first_entity_last", "last"}
    assert view.searches[0]["cells"] == [{"position_label": "first_entity_last-1", "slot": "embed"}]
    (tmp_path / "manifest.json").write_text(json.dumps({"labels": 2}))  # today's run: read as written
    assert {label for label, _, _ in LocalizeView(tmp_path).maps[0]["values"]["estimate"]} == {"first_entity", "last"}
