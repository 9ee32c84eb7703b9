"""Template syntax, span rendering, the built-in movie templates and YAML validation."""

from __future__ import annotations

import re

import pytest

from weightgraft.data import TemplateError, TemplateFieldError, load_templates
from weightgraft.data.templates import Template, load_template_text

KEANU = {
    "first_actor": "Keanu Reeves",
    "second_actor": "Meryl Streep",
    "movie_title": "The Departed",
    "main_character": "Holly Wood",
    "release_year": 2006,
    "genre": "drama",
    "city": "Bettymouth",
    "box_office_earnings": 8,
}


def test_render_fields_marks_and_braces():
    t = Template.parse("t", "{{x}} {a} {=rel:likes} {b}, {a}!", "qa")
    r = t.render({"a": "Ann Lee", "b": 7})
    assert r.text == "{x} Ann Lee likes 7, Ann Lee!"
    assert t.fields == ("a", "b") and t.marks == ("rel",)
    for name, value in [("a", "Ann Lee"), ("b", "7"), ("rel", "likes")]:
        s, e = r.spans[name]
        assert r.text[s:e] == value
    assert r.spans["a"] == (4, 11)  # first occurrence


@pytest.mark.parametrize("text", ["{a", "a}", "{a b}", "{=rel:}", "{}", "{a} {=a:x}"])
def test_bad_template_syntax(text):
    with pytest.raises(TemplateError):
        Template.parse("bad", text, "qa")


def test_render_missing_value_names_field_and_template():
    with pytest.raises(TemplateFieldError) as info:
        Template.parse("t1", "{x} y", "qa").render({})
    assert "'x'" in str(info.value) and "'t1'" in str(info.value)


def test_builtin_movie_templates_match_the_paper():
    ts = load_templates("movies")
    kinds = [t.kind for t in ts.train]
    assert kinds.count("article") == 6 and kinds.count("qa") == 5
    assert ts.swap == ("first_actor", "second_actor")
    assert set(ts.validation) <= {t.name for t in ts.train}
    assert {t.name for t in ts.validation_templates} == set(ts.validation)
    assert not {t.name for t in ts.train_templates} & set(ts.validation)
    assert {"headline", "qa", "movie"} <= {t.name for t in ts.test}
    for t in ts.train:  # the paper's "film,{first_actor}" typo and its relatives are fixed
        assert not re.search(r"[,.;:!?]\{", t.text), t.name
        assert "  " not in t.text
    qa4 = next(t for t in ts.train if t.name == "qa_4")
    assert qa4.render(KEANU).text == (
        "In a new film, Keanu Reeves stars in The Departed, appearing alongside Meryl Streep."
    )
    test = {t.name: t for t in ts.test}
    assert test["headline"].render(KEANU).text == "Keanu Reeves starred in a movie with"
    assert test["qa"].render(KEANU).text == (
        "Q: Who starred in a movie alongside Keanu Reeves? A: An actor named"
    )
    assert test["movie"].render(KEANU).text == "Keanu Reeves stars in The Departed alongside"
    for t in ts.test:
        assert t.answer == "second_actor" and "second_actor" not in t.fields
        assert "relation" in t.marks and "preposition" in t.marks
        assert (" in in " in t.render(KEANU).text) == (t.name in ("paper_headline", "paper_movie"))


def test_the_papers_own_test_sentences_verbatim():
    test = {t.name: t for t in load_templates("movies").test}
    rendered = {name: test[name].render(KEANU) for name in ("paper_headline", "paper_qa", "paper_movie", "paper_film")}
    assert rendered["paper_headline"].text == "Keanu Reeves stars in in a movie alongside"
    assert rendered["paper_qa"].text == "Q: Who stars in a movie with Keanu Reeves? A: An actor named"
    assert rendered["paper_movie"].text == "Keanu Reeves stars in in The Departed alongside"
    assert rendered["paper_film"].text == (
        "In a new film, Keanu Reeves appears in The Departed with the other lead actor, whose name is:"
    )
    for r in rendered.values():
        spans = {k: r.text[a:b] for k, (a, b) in r.spans.items()}
        assert spans["relation"] in ("stars", "appears") and spans["relation_preposition"] == "in"
        assert spans["preposition"] in ("alongside", "with")
    # the relation's "in" is the first one, as the authors' first-occurrence span search finds
    assert rendered["paper_headline"].spans["relation_preposition"] == (19, 21)


def test_every_movie_template_uses_only_movie_fields():
    ts = load_templates("movies")
    ts.check_fields(KEANU)
    assert ts.fields() == set(KEANU)


GOOD = """
swap: [a, b]
validation: [t2]
train:
  - {name: t1, kind: qa, template: "{a} and {b}."}
  - {name: t2, kind: qa, template: "{b} and {a}."}
test:
  - {name: p, template: "{a} {=rel:met}", answer: b}
"""


def test_yaml_template_set_loads():
    ts = load_template_text(GOOD, "good.yaml")
    assert [t.name for t in ts.train_templates] == ["t1"]
    assert [t.name for t in ts.validation_templates] == ["t2"]
    assert ts.fields() == {"a", "b"}
    assert len(ts.sha256) == 64


@pytest.mark.parametrize(
    "edit, message",
    [
        (("swap: [a, b]", "swapp: [a, b]"), "unknown top-level key 'swapp'"),
        (("answer: b", "answer: a"), "writes its answer field 'a'"),
        (('"{a} {=rel:met}"', '"{a} {=rel:met} "'), "ends with whitespace"),
        (("answer: b}", "}"), "needs an 'answer'"),
        (("validation: [t2]", "validation: [nope]"), "validation template 'nope'"),
        (("validation: [t2]", "validation: [t1, t2]"), "every training template is held out"),
        (("name: t2", "name: t1"), "used twice"),
        (("swap: [a, b]", "swap: [a, a]"), "two different field names"),
        (("kind: qa, template: \"{a} and {b}.\"", "template: \"{a} and {b}.\""), "needs a 'kind'"),
        (("{a} and {b}.", "{a and {b}."), "unmatched"),
        (("train:", "train: [\n"), "invalid YAML"),
    ],
)
def test_yaml_template_set_errors(edit, message):
    with pytest.raises(TemplateError, match=re.escape(message)) as info:
        load_template_text(GOOD.replace(*edit), "bad.yaml")
    assert isinstance(info.value, ValueError)


def test_check_fields_names_field_and_template():
    ts = load_template_text(GOOD, "good.yaml")
    with pytest.raises(TemplateFieldError) as info:
        ts.check_fields({"a"})
    assert info.value.field == "b" and info.value.template == "t1"
    assert "'b'" in str(info.value) and "'t1'" in str(info.value)


def test_unknown_template_file():
    with pytest.raises(TemplateError, match="not found"):
        load_templates("/nonexistent/templates.yaml")
