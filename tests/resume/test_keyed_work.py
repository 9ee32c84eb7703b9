"""Keyed, resumable work (``weightgraft.resume``): parts read back by key and numbered so that
no part is ever written over, and claims that a rerun may extend but not change."""

from __future__ import annotations

import pandas as pd
import pytest

from weightgraft.resume.claim import changed_entries, extends
from weightgraft.resume.parts import Parts


def _rows(*ids: int) -> pd.DataFrame:
    return pd.DataFrame({"template": ["t"] * len(ids), "example_id": list(ids), "value": [i / 2 for i in ids]})


def test_parts_are_read_back_by_key_in_the_order_they_were_added(tmp_path):
    parts = Parts(tmp_path, "exact_sufficiency_", digits=4)
    assert parts.read().empty and parts.keys(["template", "example_id"]) == set()
    first, second = parts.add(_rows(3, 1)), parts.add(_rows(2))
    assert [first.name, second.name] == ["exact_sufficiency_0000.parquet", "exact_sufficiency_0001.parquet"]
    assert parts.read()["example_id"].tolist() == [3, 1, 2]
    assert parts.keys(["template", "example_id"]) == {("t", 1), ("t", 2), ("t", 3)}
    assert Parts(tmp_path, "exact_necessity_", digits=4).read().empty  # another prefix: other parts


def test_a_part_never_writes_over_another_after_a_gap(tmp_path):
    parts = Parts(tmp_path, "part-")
    parts.add(_rows(1))
    parts.add(_rows(2))
    (tmp_path / "part-000000.parquet").unlink()  # a gap: counting the parts would name part-000001 again
    parts.add(_rows(3))
    assert sorted(parts.read()["example_id"].tolist()) == [2, 3]


def test_writers_side_by_side_read_each_others_parts(tmp_path):
    mine, theirs = Parts(tmp_path, "part-r0-", shared="part-"), Parts(tmp_path, "part-r1-", shared="part-")
    mine.add(_rows(1))
    theirs.add(_rows(2))
    theirs.add(_rows(4))
    assert [p.name for p in mine.paths()] == ["part-r0-000000.parquet", "part-r1-000000.parquet", "part-r1-000001.parquet"]
    assert mine.keys(["example_id"]) == theirs.keys(["example_id"]) == {(1,), (2,), (4,)}


def test_a_claim_allows_added_entries_and_refuses_changed_ones():
    recorded = {"a": "d1", "b": "d2"}
    assert changed_entries(recorded, {"a": "d1", "c": "d3"}) == []  # c added, b not asked for
    assert changed_entries(recorded, {"b": "other", "a": "changed"}) == ["a", "b"]
    assert extends(["sft"], ["sft", "sft2"]) and extends([], ["x"]) and extends(["a", "b"], ["a", "b"])
    assert not extends(["sft", "sft2"], ["sft"]) and not extends(["sft"], ["other", "sft"])


@pytest.mark.parametrize("digits", [4, 6])
def test_parts_are_named_as_earlier_runs_named_them(tmp_path, digits):
    # folders written before resume.parts: a rerun reads and extends them
    name = f"exact_sufficiency_{0:0{digits}d}.parquet"
    _rows(5).to_parquet(tmp_path / name, index=False)
    parts = Parts(tmp_path, "exact_sufficiency_", digits=digits)
    assert parts.keys(["example_id"]) == {(5,)}
    assert parts.add(_rows(6)).name == f"exact_sufficiency_{1:0{digits}d}.parquet"
