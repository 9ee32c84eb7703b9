"""Shared fixtures: tiny random models (``tiny_models``) and their tokenizer, in memory and
saved as model directories (``tiny_model_dirs``; the tiny world's pair, ``world_model_dirs``; a tiny
Mixtral pair and control, ``moe_dirs``, and their ``weightgraft experts`` folder, ``experts_out``); the tiny finetuning world (``tiny_training``: ``data_dir``, ``base_dir``); the ``slow`` marker (registered in pyproject.toml, the rule in
docs/development.md) also goes on every test that needs a fixture its module names in
``SLOW_FIXTURES``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import browser
import pytest
import torch
from tiny_models import VL_CONFIGS, make_donor, make_tiny, tiny_tokenizer
from tiny_training import base_dir, data_dir  # noqa: F401 - the tiny finetuning world's module fixtures

# One thread for the suite, unless its runner chose (OMP_NUM_THREADS, WEIGHTGRAFT_THREADS): the models are
# tiny, so a second thread buys nothing, and beside another job its spinning waits made test_engine.py 7x
# slower on 2 cores (340 s against 46 s; src/weightgraft/runtime.py measures the same on real forwards).
# Subprocesses (the CLI, torchrun) inherit it, as weightgraft's own thread default reads it.
if not (os.environ.get("OMP_NUM_THREADS") or os.environ.get("WEIGHTGRAFT_THREADS")):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_report_header() -> str:
    """One line on whether the browser tests can run here, and how to make them run."""
    return browser.header()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The same line at the end, where ``pytest -q`` (the README's command) shows no header."""
    if browser.CHROMIUM is None:
        terminalreporter.write_line(browser.header())


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``slow`` on each test that needs one of its module's ``SLOW_FIXTURES``: an expensive module
    fixture (a localize run, the paper pipeline) is paid by whichever of its tests runs first, so
    ``make check`` leaves out all of them or its cost only moves to the next; and on every case of a
    test function listed in ``tests/slow_tests.txt`` (measured: docs/development.md)."""
    measured = measured_slow()
    for item in items:
        names = getattr(getattr(item, "module", None), "SLOW_FIXTURES", ())
        if set(names) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if _wrapper_case_beyond_the_engine(item):
            item.add_marker(pytest.mark.slow)
        if _function_id(item) in measured:
            item.add_marker(pytest.mark.slow)


SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def measured_slow() -> set[str]:
    """``tests/slow_tests.txt``: the test functions marked slow by their measured time (``path::name``)."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_TESTS.read_text().splitlines())
    return {line for line in lines if line}


def _function_id(item: pytest.Item) -> str:
    """``tests/engine/test_x.py::test_name`` for every case of a test function (no class, no parameters)."""
    nodeid = getattr(item, "nodeid", "")
    path, _, rest = nodeid.partition("::")
    return f"{path}::{rest.split('[', 1)[0].rsplit('::', 1)[-1]}" if rest else nodeid


# Where a vision-language wrapper runs in `make check`: its own tests and the engine's matrix against
# the per-token definition. Its text family runs every other matrix there already; the wrapper (Gemma 3's
# aside) runs them in `make test` (docs/development.md).
_WRAPPER_FAST_FILES = ("test_engine.py", "test_vision_language.py", "test_vision_language_loading.py")


def _wrapper_case_beyond_the_engine(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    wrappers = {v for v in params.values() if isinstance(v, str) and v in VL_CONFIGS and v != "gemma3"}
    return bool(wrappers) and Path(str(item.fspath)).name not in _WRAPPER_FAST_FILES


@pytest.fixture(scope="session")
def tiny_tok():
    """A character-level fast tokenizer (real offset mapping), right-padded."""
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_pair(tiny_tok) -> Callable[..., tuple[torch.nn.Module, torch.nn.Module]]:
    """``tiny_pair(arch, dtype=torch.float64)``: a tiny random base (4 layers, so that layer
    quarters exist) and a donor near it, with the tiny tokenizer's vocabulary (cached)."""
    cache: dict[tuple[str, torch.dtype], tuple[torch.nn.Module, torch.nn.Module]] = {}

    def build(arch: str = "llama", dtype: torch.dtype = torch.float64) -> tuple[torch.nn.Module, torch.nn.Module]:
        if (arch, dtype) not in cache:
            base = make_tiny(arch, seed=0, vocab_size=len(tiny_tok), n_layers=4).to(dtype)
            cache[(arch, dtype)] = (base, make_donor(base, seed=1))
        return cache[(arch, dtype)]

    return build


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, tiny_pair, tiny_tok) -> dict[str, Path]:
    """``{"pre": dir, "sft": dir}``: a tiny Llama pair saved with ``save_pretrained``."""
    root = tmp_path_factory.mktemp("tiny_pair")
    out = {}
    for role, model in zip(("pre", "sft"), tiny_pair("llama", torch.float32), strict=True):
        model.save_pretrained(root / role)
        tiny_tok.save_pretrained(root / role)
        out[role] = root / role
    return out


@pytest.fixture(scope="session")
def world_model_dirs(tmp_path_factory) -> dict[str, str]:
    """``{"pre": dir, "sft": dir}``: the tiny world's Llama pair (``tiny_world.loader``) saved
    with ``save_pretrained``, for tests that load models by path; read only."""
    from tiny_world import loader

    root = tmp_path_factory.mktemp("world_pair")
    out = {}
    for role in ("pre", "sft"):
        lm = loader(f"tiny-llama:{role}")
        lm.model.save_pretrained(root / role)
        lm.tokenizer.save_pretrained(root / role)
        out[role] = str(root / role)
    return out


@pytest.fixture(scope="session")
def moe_dirs(tmp_path_factory) -> dict[str, str]:
    """A tiny random Mixtral pair (and control) on the tiny world, saved as model folders, with
    the world's data folder (the expert-map and explore tests read them)."""
    from tiny_world import tokenizer, write_world

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
def experts_out(moe_dirs, tmp_path_factory) -> Path:
    """One ``weightgraft experts`` folder (finetune and control), shared by the tests that read it."""
    from typer.testing import CliRunner

    from weightgraft.cli import app

    out = tmp_path_factory.mktemp("experts") / "experts"
    result = CliRunner().invoke(app, ["experts", "--pre", moe_dirs["pre"], "--sft", moe_dirs["sft"], "--control",
                                      moe_dirs["control"], "--data", moe_dirs["data"], "--template", "headline",
                                      "--template", "qa", "--metric", "first_logprob", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report' / 'index.html'}" in result.output.replace("\n", "")
    return out
