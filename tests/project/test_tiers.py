"""The two tiers: ``make test`` runs the whole suite, ``make check`` runs ``make lint`` and then the
tests not marked ``slow`` (the rule: docs/development.md). The marker is registered, the Makefile's
targets are the ones the docs name, the modules that are slow by kind are marked whole, every
``SLOW_FIXTURES`` name is a fixture of its module, every line of ``tests/slow_tests.txt`` (slow by
measured time) names a test, and pytest's own selection keeps the engine's tests and leaves those out."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import measured_slow, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# slow by kind, marked whole (``pytestmark``): the docs, ruff/mypy, torchrun, headless Chromium,
# the real embedded model, the statistics' simulations
SLOW_MODULES = ("test_docs", "test_lint", "test_distributed", "test_explore_browser", "test_api_real", "test_stats")
# the engine against the per-token definition on every architecture, the API, refusals: in the fast tier
FAST_MODULES = ("test_engine", "test_partial", "test_scaled", "test_units", "test_cells", "test_dtypes", "test_api",
                "test_input_errors", "test_engine_errors", "test_refusals")


def _recipe(target: str) -> list[str]:
    """The command lines of a Makefile target, and its prerequisites as the first entry."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return [lines[start].split(":", 1)[1].strip(), *body]


def _path(name: str) -> Path:
    """A test module by name, in the folder of the package it tests."""
    (path,) = TESTS.glob(f"*/{name}.py")
    return path


def _module_level(name: str) -> dict[str, ast.expr]:
    tree = ast.parse(_path(name).read_text(encoding="utf-8"))
    return {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def _is_slow(expr: ast.expr | None) -> bool:
    return expr is not None and "mark.slow" in ast.unparse(expr)


def test_the_slow_marker_is_registered():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.split(":", 1)[0].strip() == "slow" for m in config["markers"])


def test_make_check_is_lint_then_the_suite_without_slow_and_make_test_all_of_it():
    check, lint, test = _recipe("check"), _recipe("lint"), _recipe("test")
    assert lint[0] == test[0] == "$(STAMP)"  # the same install step
    assert lint[1:] == ["$(BIN)/python tests/lint.py"], lint  # as tests/project/test_lint.py in `make test`
    assert check[0] == "lint", check  # lint first, then the fast tier
    assert check[1:] == ['$(BIN)/python -m pytest -q -m "not slow"'], check
    assert test[1:] == ["$(BIN)/python -m pytest -q"], test  # CI's command (.ci/run): the whole suite


def test_modules_slow_by_kind_are_marked_whole_and_the_engines_are_not():
    for name in SLOW_MODULES:
        assert _is_slow(_module_level(name).get("pytestmark")), f"{name}.py: no `pytestmark = pytest.mark.slow`"
    for name in FAST_MODULES:
        assert not _is_slow(_module_level(name).get("pytestmark")), f"{name}.py is marked slow as a whole"


def test_the_tests_sit_in_the_folder_of_the_package_they_test():
    """Test modules live in folders (tests/engine, tests/models, ...), none at the top, and no two share
    a name (pytest imports each by its name alone)."""
    assert not list(TESTS.glob("test_*.py"))
    names = [p.stem for p in TESTS.glob("*/test_*.py")]
    assert len(names) == len(set(names)) and len(names) > 100
    packages = {p.name for p in (ROOT / "src" / "weightgraft").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders - packages == {"project"}, folders - packages  # project: the CLI, docs, install and layout


def test_every_slow_fixture_is_a_fixture_of_its_module():
    named = 0
    for path in sorted(TESTS.glob("*/test_*.py")):
        value = _module_level(path.stem).get("SLOW_FIXTURES")
        if value is None:
            continue
        names = ast.literal_eval(value)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        fixtures = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                    and any("fixture" in ast.unparse(d) for d in node.decorator_list)}
        assert isinstance(names, tuple) and set(names) <= fixtures, f"{path.name}: {names} not among {fixtures}"
        named += len(names)
    assert named >= 1


def test_every_measured_slow_test_names_a_test_function_of_its_file():
    """``tests/slow_tests.txt`` (the tests marked slow by their measured time) names only test functions that
    exist, so a renamed test does not fall silently into the fast tier."""
    measured = measured_slow()
    assert measured
    for entry in sorted(measured):
        path, _, name = entry.partition("::")
        assert path.startswith("tests/") and name.startswith("test_") and "[" not in name, entry
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        defs = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in defs, f"tests/slow_tests.txt: {entry} is not a test of {path}: rename or remove its line"


def test_a_measured_slow_test_is_marked_in_every_case():
    marks: dict[str, list] = {"case": [], "other": []}
    entry = sorted(measured_slow())[0]
    pytest_collection_modifyitems([
        SimpleNamespace(nodeid=f"{entry}[a-b]", module=None, fixturenames=[], add_marker=marks["case"].append),
        SimpleNamespace(nodeid=f"{entry}_not[a]", module=None, fixturenames=[], add_marker=marks["other"].append)])
    assert [m.name for m in marks["case"]] == ["slow"] and marks["other"] == []


def test_a_test_that_needs_a_slow_fixture_is_marked():
    module = SimpleNamespace(SLOW_FIXTURES=("full_run",))
    marks: dict[str, list] = {"uses": [], "other": [], "plain": []}

    def item(key: str, fixtures: list[str], mod: object) -> SimpleNamespace:
        return SimpleNamespace(module=mod, fixturenames=fixtures, add_marker=marks[key].append)

    pytest_collection_modifyitems([item("uses", ["tmp_path", "full_run"], module),
                                   item("other", ["tmp_path"], module),
                                   item("plain", ["full_run"], SimpleNamespace())])
    assert [m.name for m in marks["uses"]] == ["slow"] and marks["other"] == [] and marks["plain"] == []


@pytest.mark.slow
def test_pytest_selects_the_fast_tier_as_the_makefile_asks():
    """What pytest itself collects under ``-m "not slow"`` from modules of each kind."""
    files = ["tests/engine/test_engine.py", "tests/project/test_docs.py", "tests/paper/test_paper_pipeline.py", "tests/project/test_refusals.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "not slow", *files], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    by_file = {f: [i for i in ids if i.startswith(f)] for f in files}
    assert len(by_file["tests/engine/test_engine.py"]) > 100
    assert by_file["tests/project/test_docs.py"] == []
    assert not [i for i in by_file["tests/paper/test_paper_pipeline.py"] if "test_each_precondition" in i]  # full_run's
    assert "tests/project/test_refusals.py::test_cli_errors_are_one_line" not in ids and by_file["tests/project/test_refusals.py"]
    assert re.search(r"\d+ deselected", out.stdout), out.stdout[-500:]
