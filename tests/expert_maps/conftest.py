"""The expert-map tests' shared folders: a tiny random Mixtral pair (and control) on the tiny
world, and one ``weightgraft experts`` folder written from them, run once per session of tests."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from weightgraft.cli import app
from tiny_models import make_donor, make_tiny
from tiny_world import tokenizer, write_world


@pytest.fixture(scope="session")
def moe_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_world")
    tok = tokenizer()
    base = make_tiny("mixtral", seed=0, vocab_size=len(tok))
    out = {"data": str(write_world(root / "data"))}
    for role, model in (("pre", base), ("sft", make_donor(base, 1)), ("control", make_donor(base, 2))):
        model.save_pretrained(root / role)
        tok.save_pretrained(root / role)
        out[role] = str(root / role)
    return out


@pytest.fixture(scope="session")
def experts_out(moe_dirs, tmp_path_factory):
    """One ``weightgraft experts`` folder (finetune and control), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("experts") / "experts"
    result = CliRunner().invoke(app, ["experts", "--pre", moe_dirs["pre"], "--sft", moe_dirs["sft"], "--control",
                                      moe_dirs["control"], "--data", moe_dirs["data"], "--template", "headline",
                                      "--template", "qa", "--metric", "first_logprob", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report' / 'index.html'}" in result.output.replace("\n", "")
    return out
