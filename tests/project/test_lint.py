"""Lint and types as part of the README's test command: ruff over the whole tree, mypy over the
package, strict (as configured in pyproject.toml) on ``api``, ``schemes`` and ``engine`` with no
error, and elsewhere against a stated baseline (``tests/mypy_baseline.json``: errors per file)
that may only shrink: a file with more errors than its line fails, and a file with fewer fails
too, until its line is lowered, so the baseline always says where the code stands."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # `make check` leaves these out: ruff and mypy over the tree

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).parent.parent / "mypy_baseline.json"
STRICT = ("src/weightgraft/api/", "src/weightgraft/schemes/", "src/weightgraft/engine/")
ERROR = re.compile(r"^(?P<file>[^:]+\.py):\d+(?::\d+)?: error: ")


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' (the test extra pins it)")
    return found


def test_ruff_finds_nothing() -> None:
    out = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "src", "tests", "benchmarks",
                          "examples", "docs"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def mypy_errors() -> Counter[str]:
    """Errors per file of ``mypy`` over the package, as pyproject.toml configures it."""
    out = subprocess.run([_tool("mypy"), "--no-error-summary", "--hide-error-context"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode not in (0, 1):
        pytest.fail(f"mypy did not run: {out.stderr[-2000:]}")
    return Counter(m["file"] for line in out.stdout.splitlines() if (m := ERROR.match(line)))


def test_mypy_strict_floors_are_clean_and_the_rest_holds_its_baseline() -> None:
    errors = mypy_errors()
    strict = {f: n for f, n in errors.items() if f.startswith(STRICT)}
    assert not strict, f"mypy errors where strict typing holds: {strict}"
    baseline: dict[str, int] = json.loads(BASELINE.read_text())
    worse = {f: (n, baseline.get(f, 0)) for f, n in errors.items() if n > baseline.get(f, 0)}
    better = {f: (errors.get(f, 0), n) for f, n in baseline.items() if errors.get(f, 0) < n}
    assert not worse, f"more mypy errors than the baseline allows (file: (now, baseline)): {worse}"
    assert not better, (f"fewer mypy errors than tests/mypy_baseline.json says: lower these lines "
                        f"(file: (now, baseline)): {better}")
