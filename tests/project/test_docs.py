"""The docs run as written (on tiny models), so they cannot rot: every ```python block of the
README and of every page under docs/, the tutorial notebook cell by cell, and the examples; the
docs site builds with ``mkdocs build --strict`` and a broken link fails it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tiny_world
import torch
from tiny_models import make_donor, make_tiny

import weightgraft as wg

pytestmark = pytest.mark.slow  # `make check` leaves these out: the docs' blocks, tutorial, examples, site build

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# The README, then every page of the docs site; docs/index.md is a stub the site fills with the README.
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
# A block that cannot run on tiny models is fenced ```python no-run, right under a line
# <!-- no-run: why -->. Each is listed here with its reason, so none is added unnoticed.
NO_RUN: dict[str, list[str]] = {
    "docs/big-models.md": ["loads a quantized embedded model (bitsandbytes), too slow for the docs test on tiny models"],
}

_FENCE = re.compile(r"^```python(?P<flag>[^\n]*)\n(?P<code>.*?)^```[ \t]*$", flags=re.S | re.M)
_REASON = re.compile(r"<!--\s*no-run:\s*(?P<reason>.+?)\s*-->\s*$")


def _python_blocks(text: str) -> list[str]:
    """The ```python blocks that run (``no-run`` ones left out)."""
    return [code for code, reason in _blocks(text) if reason is None]


def _blocks(text: str) -> list[tuple[str, str | None]]:
    """Every ```python block in order, with its no-run reason (None: it runs). A ``no-run``
    block without an ``<!-- no-run: reason -->`` line right above it is an error."""
    out = []
    for match in _FENCE.finditer(text):
        flag = match["flag"].strip()
        if flag not in ("", "no-run"):
            raise AssertionError(f"unknown python fence flag {flag!r} (only `no-run`)")
        if flag != "no-run":
            out.append((match["code"], None))
            continue
        above = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = _REASON.search(above)
        if reason is None:
            raise AssertionError(f"a ```python no-run block without `<!-- no-run: reason -->` above it:\n{match['code']}")
        out.append((match["code"], reason["reason"]))
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.fixture
def tiny_notebook(monkeypatch):
    """``wg.load`` handing out tiny models (a 4-layer Llama and a donor near it, with a
    word-level tokenizer over the docs' actor prompts) in place of SmolLM2 and a finetune."""
    tok = tiny_world.tokenizer()
    pre = make_tiny("llama", vocab_size=len(tok), n_layers=4)
    sft = make_donor(pre, seed=1)
    bases = {"smollm2-135m", "demo:pre"}
    monkeypatch.setattr("weightgraft.api.load.load", lambda spec, **kw: (pre if spec in bases else sft, tok))
    return pre, sft, tok


def _run_blocks(blocks: list[str], ns: dict, where: str) -> None:
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{where} python block {i}", "exec"), ns)
        except Exception as exc:  # name the block that broke
            raise AssertionError(f"{where} python block {i} failed: {exc!r}\n{block}") from exc


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_python_block_of_the_docs_runs(page, tiny_notebook, tmp_path, monkeypatch):
    """Each page's ```python blocks run in order in one namespace on tiny models. A docs page
    continues from the README's notebook example (``wg``, ``pre``, ``sft``, ``tok``, ``prompts``,
    ``out``), which runs first in its namespace."""
    pre, sft, tok = tiny_notebook
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    blocks = _blocks(page.read_text(encoding="utf-8"))
    no_run = [reason for _, reason in blocks if reason is not None]
    assert no_run == NO_RUN.get(_rel(page), []), f"{_rel(page)}: no-run blocks {no_run}; list them in NO_RUN"
    ns: dict = {}
    if page.name != "README.md":
        _run_blocks(_python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))[:1], ns, "README.md")
    _run_blocks([code for code, reason in blocks if reason is None], ns, _rel(page))
    if page.name == "README.md":
        assert len(blocks) >= 1 and ns["out"].logits.shape == (2, len(tok))
    if page.name == "api.md":
        assert ns["out"].logits.shape == (2, len(tok))
        assert len(ns["df"]) == 2 * len(ns["schemes"])
    if page.name == "engine.md":  # the hand-made "LT" map equals wg.graft's last-token rule
        lt = wg.graft({"pre": pre, "sft": sft}, tok, ns["prompts"], wg.Rule(model="sft", positions="last"))
        torch.testing.assert_close(ns["logits"][torch.arange(2), ns["last"]], lt.logits, rtol=1e-5, atol=1e-5)


def test_the_docs_blocks_are_counted_and_no_run_ones_say_why():
    """How many blocks run, and every one that does not, with its reason (reported as a
    warning, so a run of the suite shows it; never a silent skip)."""
    counts = {_rel(p): _blocks(p.read_text(encoding="utf-8")) for p in PAGES}
    ran = sum(1 for blocks in counts.values() for _, reason in blocks if reason is None)
    skipped = [(page, reason) for page, blocks in counts.items() for _, reason in blocks if reason is not None]
    assert ran >= 10, counts.keys()
    assert {page for page, _ in skipped} <= set(NO_RUN), skipped
    if skipped:
        warnings.warn(f"docs python blocks: {ran} run on tiny models, {len(skipped)} marked no-run: "
                      + "; ".join(f"{page}: {reason}" for page, reason in skipped), stacklevel=1)


def test_a_no_run_block_needs_its_reason():
    page = "text\n<!-- no-run: needs a GPU -->\n```python no-run\nrun_on_gpu()\n```\n\n```python\nx = 1\n```\n"
    assert _blocks(page) == [("run_on_gpu()\n", "needs a GPU"), ("x = 1\n", None)]
    assert _python_blocks(page) == ["x = 1\n"]
    with pytest.raises(AssertionError, match="without"):
        _blocks("```python no-run\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="unknown python fence flag"):
        _blocks("```python skip\nx = 1\n```\n")


def test_the_readme_fits_on_a_few_screens_and_links_every_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    linked = set(re.findall(r"\]\(docs/([^)#]+)\)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def _tutorial():
    spec = importlib.util.spec_from_file_location("run_tutorial", ROOT / "docs" / "run_tutorial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tutorial_notebook_runs_on_tiny_models(tmp_path, tiny_model_dirs, monkeypatch):
    """docs/tutorial.ipynb, every code cell in order in this process, its ``parameters`` cell
    followed by tiny models' folders and a tiny world (as papermill injects parameters)."""
    import ast

    monkeypatch.chdir(tmp_path)
    runner = _tutorial()
    notebook = runner.read_notebook()
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []), "the first code cell is the parameters cell"
    assigned = {t.id for node in ast.parse("".join(code[0]["source"])).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    overrides = {"PRE": str(tiny_model_dirs["pre"]), "SFT": str(tiny_model_dirs["sft"]),
                 "DATA": str(tiny_world.write_world(tmp_path / "data", n=6)), "OUT": str(tmp_path / "cells"),
                 "N_PROMPTS": 4}
    assert assigned == set(overrides), "every parameter is replaced here (none left at the demo's)"
    ns: dict = {}
    records = runner.run_cells(notebook, overrides, ns)
    assert len(records) == len(code) >= 8
    assert len(ns["prompts"]) == 4 and set(ns["sweep"]["scheme"]) >= {"PRE", "SFT", "FE", "LT", "FE+LT"}
    assert len(ns["df"]) == 4 * 3 and ns["result"].run_dir.is_relative_to(tmp_path)
    assert (ns["result"].run_dir / "cells.parquet").is_file() and ns["command"].startswith("weightgraft explore -m pre=")
    # what a cell shows is kept as text (the notebook written by `make docs` holds it)
    written = runner.with_outputs(notebook, records, overrides)
    assert written["metadata"]["weightgraft"]["machine"] and any(c.get("outputs") for c in written["cells"])


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_the_docs_site_builds_strict_and_a_broken_link_fails_it(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed: pip install -c constraints.txt -e '.[docs]'")
    done = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "api" / "index.html").is_file()
    assert "Two commands" in (site / "index.html").read_text(encoding="utf-8")  # the README is the first page
    assert (site / "tutorial.ipynb").is_file()
    # a copy of the docs with one link to a page that does not exist: the strict build fails on it
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    page = copy / "docs" / "api.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [a page that is gone](no-such-page.md).\n", encoding="utf-8")
    broken = _mkdocs(copy / "mkdocs.yml", tmp_path / "broken-site")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stdout + broken.stderr


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
