"""`weightgraft check` on two tiny local models saved with save_pretrained."""

from __future__ import annotations

import pytest
from tiny_models import make_donor, make_tiny, tiny_tokenizer
from typer.testing import CliRunner

import weightgraft.engine.check as check_mod
from weightgraft.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    tok = tiny_tokenizer()
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    base = make_tiny("llama", vocab_size=len(tok))
    for name, model in {"base": base, "donor": make_donor(base, 1), "donor2": make_donor(base, 2)}.items():
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        dirs[name] = str(root / name)
    other = make_tiny("gpt2", vocab_size=len(tok))
    other.save_pretrained(root / "gpt2")
    tok.save_pretrained(root / "gpt2")
    dirs["gpt2"] = str(root / "gpt2")
    return dirs


@pytest.mark.slow
def test_check_passes_on_a_local_pair(model_dirs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Keanu Reeves starred in a movie with\nQ: Who? A:\n\nshort\n")
    result = runner.invoke(
        app, ["check", model_dirs["base"], model_dirs["donor"], "--prompts", str(prompts)]
    )
    assert result.exit_code == 0, result.output
    assert "PASS: max |Δ logit|" in result.output
    assert "random cells" in result.output


def test_check_in_float32_uses_its_tolerance(model_dirs):
    result = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--dtype", "float32", "--maps", "1"])
    assert result.exit_code == 0, result.output
    assert "atol 0.0001, rtol 0.001" in result.output


@pytest.mark.slow
def test_check_takes_several_donors(model_dirs):
    result = runner.invoke(
        app, ["check", model_dirs["base"], model_dirs["donor"], model_dirs["donor2"], "--maps", "1"]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_check_fails_when_the_engine_is_wrong(model_dirs, monkeypatch):
    real = check_mod.graft_forward

    def off_by_a_little(*args, **kwargs):
        return real(*args, **kwargs) + 1e-3

    monkeypatch.setattr(check_mod, "graft_forward", off_by_a_little)
    result = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert result.exit_code == 1
    assert "FAIL" in result.output


def test_check_refuses_models_that_do_not_match(model_dirs):
    result = runner.invoke(app, ["check", model_dirs["base"], model_dirs["gpt2"]])
    assert result.exit_code != 0
    assert "'gpt2' model" in str(result.exception)


def test_report_tolerance_is_relative_to_logit_scale():
    report = check_mod.CheckReport(
        cases=[check_mod.CheckCase("x", max_abs_diff=2e-4, logit_scale=30.0, top1_agree=1.0)],
        atol=1e-4, rtol=1e-5,
    )
    assert report.passed  # 2e-4 <= 1e-4 + 3e-4
    worse = check_mod.CheckCase("y", max_abs_diff=5e-4, logit_scale=30.0, top1_agree=1.0)
    assert not report.passed_case(worse)
    flipped = check_mod.CheckCase("z", max_abs_diff=0.0, logit_scale=30.0, top1_agree=0.9)
    assert not report.passed_case(flipped)


@pytest.mark.slow
def test_check_covers_the_runners_prefix_sharing(model_dirs, monkeypatch):
    ok = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert ok.exit_code == 0 and "prefix sharing (runner)" in ok.output
    real = check_mod.prefix_forward
    monkeypatch.setattr(check_mod, "prefix_forward", lambda *a, **k: real(*a, **k) + 1e-3)
    bad = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert bad.exit_code == 1 and "FAIL" in bad.output


def test_uniform_maps_are_also_held_to_the_plain_forward(model_dirs):
    """On "all from model k" the engine equals model k's own HF forward; random maps have no
    plain forward to compare with."""
    from weightgraft.models import load_model
    from weightgraft.models.tokenization import batch_encode

    loaded = [load_model(model_dirs[k]) for k in ("base", "donor")]
    ids, mask = batch_encode(loaded[0].tokenizer, list(check_mod.DEFAULT_PROMPTS))
    report = check_mod.check_engine([m.model for m in loaded], ids, mask, n_random=1)
    uniform = [c for c in report.cases if c.name.startswith("all from model")]
    assert len(uniform) == 2
    for case in uniform:
        assert case.engine_vs_plain is not None and case.engine_vs_plain <= 1e-5, case
        assert case.reference_vs_plain is not None and case.reference_vs_plain <= 1e-4, case
    assert all(c.engine_vs_plain is None for c in report.cases if c not in uniform)


@pytest.mark.slow
def test_check_says_when_the_gap_is_the_references(model_dirs, monkeypatch):
    real = check_mod.per_token_forward
    monkeypatch.setattr(check_mod, "per_token_forward", lambda *a, **k: real(*a, **k) + 1e-3)
    result = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert result.exit_code == 1 and "FAIL" in result.output
    assert "the gap is the reference's own rounding" in " ".join(result.output.split())
    assert "all from model 0, against its plain forward pass: engine max" in " ".join(result.output.split())


@pytest.mark.slow
def test_check_does_not_blame_the_reference_when_the_engine_is_off(model_dirs, monkeypatch):
    real = check_mod.graft_forward
    monkeypatch.setattr(check_mod, "graft_forward", lambda *a, **k: real(*a, **k) + 1e-3)
    result = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert result.exit_code == 1
    assert "reference's own rounding" not in " ".join(result.output.split())


@pytest.mark.slow
def test_check_covers_depth_sharing(model_dirs, monkeypatch):
    """The exact-cells path (depth sharing) is a case of its own, and a wrong one fails."""
    ok = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert ok.exit_code == 0 and "depth sharing (cells)" in ok.output
    real = check_mod.depth_forward
    monkeypatch.setattr(check_mod, "depth_forward", lambda *a, **k: real(*a, **k) + 1e-3)
    bad = runner.invoke(app, ["check", model_dirs["base"], model_dirs["donor"], "--maps", "1"])
    assert bad.exit_code == 1 and "FAIL" in bad.output
