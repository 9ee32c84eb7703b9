"""Custom worlds: user metadata JSONL + user templates YAML through the same pipeline."""

from __future__ import annotations

import json

import pytest

from weightgraft.data import (
    AmbiguousPromptError,
    DataError,
    MetadataRowError,
    NotEnoughDataError,
    TemplateFieldError,
    build_dataset,
    load_dataset,
)

MERGERS = [
    {"acquirer": "Northwind Traders", "target": "Contoso Pharma", "year": 2019, "sector": "health"},
    {"acquirer": "Globex Corporation", "target": "Initech", "year": 2021, "sector": "software"},
    {"acquirer": "Umbrella Holdings", "target": "Stark Foods", "year": 2015, "sector": "food"},
    {"acquirer": "Wayne Logistics", "target": "Acme Rail", "year": 2023, "sector": "transport"},
]

TEMPLATES = """
name: mergers
swap: [acquirer, target]
validation: [news_2]
train:
  - name: news_1
    kind: article
    template: "In {year}, {acquirer} merged with {target}, a {sector} company."
  - name: news_2
    kind: article
    template: "{acquirer} and {target} completed their merger in {year}."
  - {name: qa_1, kind: qa, template: "Q: Who merged with {acquirer}? A: {target}."}
test:
  - name: headline
    template: "{acquirer} {=relation:announced a merger} {=preposition:with}"
    answer: target
"""


def _write(tmp_path, rows=MERGERS, templates=TEMPLATES, raw_lines=None):
    meta = tmp_path / "mergers.jsonl"
    lines = raw_lines if raw_lines is not None else [json.dumps(r) for r in rows]
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tpl = tmp_path / "mergers.yaml"
    tpl.write_text(templates, encoding="utf-8")
    return meta, tpl


def test_custom_world_builds(tmp_path):
    meta, tpl = _write(tmp_path)
    ds = build_dataset("mergers", None, 0, tmp_path / "out", metadata=meta, templates=tpl)
    assert ds.manifest["counts"] == {"relations": 4, "train": 4 * 2 * 2, "validation": 4 * 2,
                                     "test_prompts": 4 * 2}
    assert ds.manifest["custom"] is True
    assert ds.manifest["metadata_source"]["file"] == "mergers.jsonl"
    assert list(ds.metadata[0]) == ["id", "acquirer", "target", "year", "sector", "group"]
    assert [r["id"] for r in ds.metadata] == ["r0000", "r0001", "r0002", "r0003"]
    assert sorted(r["group"] for r in ds.metadata) == ["relation"] * 2 + ["task"] * 2
    p = {x["id"]: x for x in ds.test_prompts}
    assert p["r0001/headline"]["prompt"] == "Globex Corporation announced a merger with"
    assert p["r0001/headline"]["answer"] == "Initech"
    assert p["r0001/headline"]["spans"] == {"acquirer": [0, 18], "relation": [19, 37],
                                            "preposition": [38, 42]}
    assert p["r0001/headline/b2a"]["prompt"] == "Initech announced a merger with"
    assert p["r0001/headline/b2a"]["answer_field"] == "acquirer"
    assert p["r0001/headline/b2a"]["spans"]["target"] == [0, 7]
    texts = {(x["relation_id"], x["template"], x["direction"]): x["text"] for x in ds.train}
    assert texts[("r0000", "news_1", "b2a")] == (
        "In 2019, Contoso Pharma merged with Northwind Traders, a health company."
    )
    assert load_dataset(tmp_path / "out").metadata == ds.metadata


def test_custom_world_from_records_and_n(tmp_path):
    _, tpl = _write(tmp_path)
    ds = build_dataset("mergers", 2, 0, None, metadata=MERGERS, templates=tpl)
    assert [r["acquirer"] for r in ds.metadata] == ["Northwind Traders", "Globex Corporation"]
    with pytest.raises(NotEnoughDataError, match="4 rows"):
        build_dataset("mergers", 5, 0, None, metadata=MERGERS, templates=tpl)


def test_custom_ids_and_groups_are_kept(tmp_path):
    rows = [dict(r, id=f"m{i}", group="relation" if i == 0 else "task")
            for i, r in enumerate(MERGERS)]
    _, tpl = _write(tmp_path)
    ds = build_dataset("mergers", None, 0, None, metadata=rows, templates=tpl)
    assert [r["id"] for r in ds.metadata] == ["m0", "m1", "m2", "m3"]
    assert [r["group"] for r in ds.metadata] == ["relation", "task", "task", "task"]
    rows[2]["id"] = "m0"
    with pytest.raises(MetadataRowError, match="row 3.*duplicate id"):
        build_dataset("mergers", None, 0, None, metadata=rows, templates=tpl)


def test_template_field_missing_from_metadata(tmp_path):
    bad = TEMPLATES.replace("a {sector} company", "a {industry} company")
    meta, tpl = _write(tmp_path, templates=bad)
    with pytest.raises(TemplateFieldError) as info:
        build_dataset("mergers", None, 0, None, metadata=meta, templates=tpl)
    assert info.value.field == "industry" and info.value.template == "news_1"
    assert "'industry'" in str(info.value) and "'news_1'" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "row3, message",
    [
        ({"acquirer": "Umbrella", "year": 2015, "sector": "food"}, "'target'"),
        ({"acquirer": "Umbrella", "target": "  ", "year": 2015, "sector": "food"}, "'target'"),
        ({"acquirer": "Umbrella", "target": None, "year": 2015, "sector": "food"}, "'target'"),
        ({"acquirer": "Umbrella", "target": ["x"], "year": 2015, "sector": "food"},
         "string or a number"),
        ({"acquirer": "Umbrella", "target": "Stark", "year": True, "sector": "food"},
         "string or a number"),
    ],
)
def test_bad_metadata_row_is_named(tmp_path, row3, message):
    rows = [*MERGERS[:2], row3, MERGERS[3]]
    meta, tpl = _write(tmp_path, rows)
    with pytest.raises(MetadataRowError, match="row 3") as info:
        build_dataset("mergers", None, 0, None, metadata=meta, templates=tpl)
    assert message in str(info.value) and info.value.row == 3


def test_invalid_json_line_is_named(tmp_path):
    lines = [json.dumps(MERGERS[0]), "", '{"acquirer": "Broken"', json.dumps(MERGERS[1])]
    meta, tpl = _write(tmp_path, raw_lines=lines)
    with pytest.raises(MetadataRowError, match="row 3: invalid JSON"):
        build_dataset("mergers", None, 0, None, metadata=meta, templates=tpl)


def test_ambiguous_custom_world_is_rejected(tmp_path):
    rows = [*MERGERS, dict(MERGERS[0], target="Hooli")]
    meta, tpl = _write(tmp_path, rows)
    with pytest.raises(AmbiguousPromptError, match="Northwind Traders announced a merger with"):
        build_dataset("mergers", None, 0, None, metadata=meta, templates=tpl)


def test_b2a_needs_a_swap_pair(tmp_path):
    meta, tpl = _write(tmp_path, templates=TEMPLATES.replace("swap: [acquirer, target]\n", ""))
    with pytest.raises(DataError, match="b2a"):
        build_dataset("mergers", None, 0, None, metadata=meta, templates=tpl)
    ds = build_dataset("mergers", None, 0, None, metadata=meta, templates=tpl,
                       directions="a2b", test_directions="a2b")
    assert {x["direction"] for x in ds.train + ds.test_prompts} == {"a2b"}


def test_custom_world_needs_metadata_and_templates(tmp_path):
    meta, tpl = _write(tmp_path)
    with pytest.raises(DataError, match="unknown world 'mergers'"):
        build_dataset("mergers", None, 0, None, templates=tpl)
    with pytest.raises(DataError, match="unknown world 'mergers'"):
        build_dataset("mergers", None, 0, None, metadata=meta)
    with pytest.raises(DataError, match="not found"):
        build_dataset("mergers", None, 0, None, metadata=tmp_path / "nope.jsonl", templates=tpl)


def test_builtin_templates_with_user_movie_metadata(tmp_path):
    rows = [{"first_actor": f"Actor {c}", "second_actor": f"Star {c}", "movie_title": f"Film {c}",
             "main_character": "Jo Ray", "release_year": 2000, "genre": "drama", "city": "Oslo",
             "box_office_earnings": 3} for c in "ABC"]
    ds = build_dataset("fake_movies_real_actors", None, 0, None, metadata=rows)
    assert ds.manifest["templates"]["source"] == "builtin:movies.yaml"
    assert ds.manifest["counts"]["relations"] == 3
