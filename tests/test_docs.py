"""The README's code and the examples run as written (on tiny models), so the docs cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_world
import torch
from tiny_models import make_donor, make_tiny

import weightgraft as wg

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_every_readme_python_block_runs(monkeypatch):
    """Each ```python block runs in order in one namespace; ``wg.load`` hands out tiny models
    (a 4-layer Llama and a donor near it) in place of SmolLM2 and a finetune."""
    tok = tiny_world.tokenizer()  # word-level over the README's actor prompts
    pre = make_tiny("llama", vocab_size=len(tok), n_layers=4)
    sft = make_donor(pre, seed=1)
    monkeypatch.setattr("weightgraft.api.load.load", lambda spec, **kw: (pre if spec == "smollm2-135m" else sft, tok))
    blocks = _python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    ns: dict = {}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), ns)
        except Exception as exc:  # name the block that broke
            raise AssertionError(f"README python block {i} failed: {exc!r}\n{block}") from exc
    assert ns["out"].logits.shape == (2, len(tok))
    assert len(ns["df"]) == 2 * len(ns["schemes"])
    # the engine block's hand-made "LT" map equals wg.graft's last-token rule
    lt = wg.graft({"pre": pre, "sft": sft}, tok, ns["prompts"], wg.Rule(model="sft", positions="last"))
    torch.testing.assert_close(ns["logits"][torch.arange(2), ns["last"]], lt.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_on_tiny_models(script, tiny_model_dirs):
    env = dict(os.environ, WG_PRE=str(tiny_model_dirs["pre"]), WG_SFT=str(tiny_model_dirs["sft"]),
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"01_graft.py", "02_compare.py"}


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "localize").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_localize_configs_of_the_docs_validate(path):
    """The configs docs/localize.md was measured with are valid localize configs, reading
    the demo's data relative to their folder."""
    from weightgraft.localization.config import load_localize_config

    config = load_localize_config(path)
    assert config.data.resolve().parent.parent == (ROOT / "runs").resolve() and config.data.name == "data"
    assert config.templates == ["paper_headline", "paper_qa"]
