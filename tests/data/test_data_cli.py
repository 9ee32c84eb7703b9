"""``weightgraft data build`` through typer's test runner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from weightgraft.cli.data import app

runner = CliRunner()


def test_build_writes_all_files(tmp_path):
    out = tmp_path / "ds"
    res = runner.invoke(app, ["build", "--world", "real_movies_real_actors_shuffled", "--n", "20",
                              "--seed", "4", "--out", str(out), "--directions", "a2b",
                              "--relation-fraction", "0.25"])
    assert res.exit_code == 0, res.output
    assert "20 relations" in res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "metadata.jsonl", "test_prompts.jsonl", "train.jsonl",
                     "validation.jsonl"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world"] == "real_movies_real_actors_shuffled" and manifest["seed"] == 4
    assert manifest["directions"] == ["a2b"] and manifest["groups"] == {"task": 15, "relation": 5}
    assert manifest["counts"]["train"] == 20 * 9


def test_build_custom_world_and_validation_templates(tmp_path):
    meta = tmp_path / "m.jsonl"
    meta.write_text(
        "\n".join(json.dumps({"a": f"Alpha {i}", "b": f"Beta {i}"}) for i in range(3)) + "\n"
    )
    tpl = tmp_path / "t.yaml"
    tpl.write_text(
        "swap: [a, b]\ntrain:\n"
        "  - {name: one, kind: qa, template: '{a} knows {b}.'}\n"
        "  - {name: two, kind: qa, template: '{b} is known by {a}.'}\n"
        "test:\n  - {name: p, template: '{a} knows', answer: b}\n"
    )
    res = runner.invoke(app, ["build", "--metadata", str(meta), "--templates", str(tpl),
                              "--validation-templates", "two", "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 0, res.output
    assert res.output == ""
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["world"] == "custom" and manifest["templates"]["validation"] == ["two"]
    assert manifest["counts"] == {"relations": 3, "train": 6, "validation": 6, "test_prompts": 6}


def test_errors_exit_2_with_a_message(tmp_path):
    res = runner.invoke(app, ["build", "--world", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert "unknown world 'nope'" in res.output
    assert not (tmp_path / "x").exists()
    res = runner.invoke(app, ["build", "--world", "real_movies_real_actors_shuffled", "--n",
                              "100000", "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "real films" in res.output


def test_worlds_command_lists_worlds():
    res = runner.invoke(app, ["worlds"])
    assert res.exit_code == 0
    for w in ("fake_movies_real_actors", "fake_movies_fake_actors",
              "real_movies_real_actors_shuffled"):
        assert w in res.output
