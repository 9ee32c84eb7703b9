"""`make lint`: ruff over the tree and mypy over the package, each held to a committed baseline.

- ruff (``[tool.ruff.lint]`` in pyproject.toml: pyflakes, pycodestyle, bugbear, blind excepts, import
  sorting) finds nothing, except three rules held to ``tests/ruff_baseline.json`` (violations per file and
  rule): C901 (a function's branches), PLR0915 (its statements) and E501 (lines over 120 characters).
- mypy, strict on ``api``, ``schemes`` and ``engine`` with no error, elsewhere held to
  ``tests/mypy_baseline.json`` (errors per file).

A baseline only shrinks: a file with more violations than its line fails, and a file with fewer fails
too until its line is lowered, so each baseline always says where the code stands.

    python tests/lint.py                    # both checks (what `make lint` runs)
    python tests/lint.py --write-baselines  # rewrite both baselines to today's counts (review the diff)

``tests/project/test_lint.py`` runs the same checks in the full suite (``make test``, CI).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF_PATHS = ("src", "tests", "benchmarks", "examples", "docs")
RUFF_BASELINE = ROOT / "tests" / "ruff_baseline.json"
MYPY_BASELINE = ROOT / "tests" / "mypy_baseline.json"
RATCHETED = ("C901", "PLR0915", "E501")  # held to RUFF_BASELINE; every other rule holds at zero
STRICT = ("src/weightgraft/api/", "src/weightgraft/schemes/", "src/weightgraft/engine/")
SHOWN = 60  # violations listed in a failure; the count says the rest
MYPY_ERROR = re.compile(r"^(?P<file>[^:]+\.py):\d+(?::\d+)?: error: ")


class LintError(Exception):
    """A check that did not hold: its message says what and where."""


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise LintError(f"{name} is not installed: pip install -e '.[test]' (the test extra pins it)")
    return found


def ruff_violations() -> list[dict]:
    """Every violation ruff finds over the tree, as pyproject.toml configures it (file relative to the root)."""
    out = subprocess.run([tool("ruff"), "check", "--output-format", "json", "--exit-zero", *RUFF_PATHS], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise LintError(f"ruff did not run: {out.stderr[-2000:]}")
    found = json.loads(out.stdout)
    for v in found:
        v["filename"] = Path(v["filename"]).resolve().relative_to(ROOT).as_posix()
    return found


def _where(v: dict) -> str:
    return f"{v['filename']}:{v['location']['row']}:{v['location']['column']}: {v['code']} {v['message']}"


def _counts(found: list[dict]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {}
    for v in found:
        if v["code"] in RATCHETED:
            counts.setdefault(v["filename"], Counter())[v["code"]] += 1
    return {f: dict(sorted(c.items())) for f, c in sorted(counts.items())}


def mypy_errors() -> Counter[str]:
    """Errors per file of ``mypy`` over the package, as pyproject.toml configures it."""
    out = subprocess.run([tool("mypy"), "--no-error-summary", "--hide-error-context"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise LintError(f"mypy did not run: {out.stderr[-2000:]}")
    return Counter(m["file"] for line in out.stdout.splitlines() if (m := MYPY_ERROR.match(line)))


def check_ruff() -> str:
    """Ruff finds nothing outside the ratcheted rules, and those hold to their baseline, file by file."""
    found = ruff_violations()
    plain = [v for v in found if v["code"] not in RATCHETED]
    if plain:
        fixable = " (`ruff check --fix src tests benchmarks examples docs` fixes the ones marked [*])" if any(
            v.get("fix") for v in plain) else ""
        raise LintError(f"ruff: {len(plain)} violation(s){fixable}:\n"
                        + "\n".join(_where(v) + (" [*]" if v.get("fix") else "") for v in plain[:SHOWN])
                        + (f"\n... and {len(plain) - SHOWN} more" if len(plain) > SHOWN else ""))
    now = _counts(found)
    baseline: dict[str, dict[str, int]] = json.loads(RUFF_BASELINE.read_text())
    worse = {(f, r): (n, baseline.get(f, {}).get(r, 0)) for f, c in now.items() for r, n in c.items()
             if n > baseline.get(f, {}).get(r, 0)}
    better = {(f, r): (now.get(f, {}).get(r, 0), n) for f, c in baseline.items() for r, n in c.items()
              if now.get(f, {}).get(r, 0) < n}
    problems = []
    if worse:
        lines = [_where(v) for v in found if (v["filename"], v["code"]) in worse]
        problems.append("ruff: more violations than tests/ruff_baseline.json allows ((file, rule): (now, baseline)): "
                        f"{worse}\nsplit the function or wrap the line:\n" + "\n".join(lines))
    if better:
        problems.append("ruff: fewer violations than tests/ruff_baseline.json says: lower these lines "
                        f"((file, rule): (now, baseline)), or run `python tests/lint.py --write-baselines`: {better}")
    if problems:
        raise LintError("\n".join(problems))
    total = sum(n for c in now.values() for n in c.values())
    return f"ruff: clean; {total} baselined violation(s) of {', '.join(RATCHETED)} in {len(now)} files"


def check_mypy() -> str:
    """No mypy error where strict typing holds; elsewhere no file above its baseline, and none below it."""
    errors = mypy_errors()
    strict = {f: n for f, n in errors.items() if f.startswith(STRICT)}
    baseline: dict[str, int] = json.loads(MYPY_BASELINE.read_text())
    worse = {f: (n, baseline.get(f, 0)) for f, n in errors.items() if n > baseline.get(f, 0)}
    better = {f: (errors.get(f, 0), n) for f, n in baseline.items() if errors.get(f, 0) < n}
    problems = []
    if strict:
        problems.append(f"mypy: errors where strict typing holds: {strict}")
    if worse:
        problems.append(f"mypy: more errors than tests/mypy_baseline.json allows (file: (now, baseline)): {worse}")
    if better:
        problems.append("mypy: fewer errors than tests/mypy_baseline.json says: lower these lines "
                        f"(file: (now, baseline)), or run `python tests/lint.py --write-baselines`: {better}")
    if problems:
        raise LintError("\n".join(problems))
    return f"mypy: strict floors clean; {sum(errors.values())} baselined error(s) in {len(errors)} files"


def write_baselines() -> None:
    """Both baselines rewritten to today's counts (strict floors excluded: they hold at zero)."""
    counts = _counts(ruff_violations())
    RUFF_BASELINE.write_text("{\n" + ",\n".join(f" {json.dumps(f)}: {json.dumps(c)}" for f, c in counts.items())
                             + "\n}\n")
    errors = {f: n for f, n in sorted(mypy_errors().items()) if not f.startswith(STRICT)}
    MYPY_BASELINE.write_text(json.dumps(errors, indent=1) + "\n")
    print(f"wrote {RUFF_BASELINE.relative_to(ROOT)} and {MYPY_BASELINE.relative_to(ROOT)}: review `git diff tests/`")


def main(argv: list[str]) -> int:
    if argv == ["--write-baselines"]:
        write_baselines()
        return 0
    if argv:
        print(__doc__)
        return 2
    failed = False
    for check in (check_ruff, check_mypy):
        try:
            print(check())
        except LintError as e:
            print(e)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
