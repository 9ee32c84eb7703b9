"""Lint and types as part of the README's test command (``make test``, CI), the same checks as
``make lint`` (``tests/lint.py``, which ``make check`` runs before the fast tier): ruff over the whole
tree with nothing found outside C901, PLR0915 and E501, and those held per file to
``tests/ruff_baseline.json``; mypy over the package, strict (as configured in pyproject.toml) on
``api``, ``schemes`` and ``engine`` with no error, and elsewhere held to ``tests/mypy_baseline.json``
(errors per file). A baseline may only shrink: a file above its line fails, and a file below it fails
too, until its line is lowered, so the baseline always says where the code stands."""

from __future__ import annotations

import json

import lint
import pytest

pytestmark = pytest.mark.slow  # `make check` runs these as `make lint` before the fast tier, not twice


def _check(check) -> None:
    try:
        check()
    except lint.LintError as e:
        pytest.fail(str(e)[-6000:], pytrace=False)


def test_ruff_finds_nothing_beyond_its_baseline() -> None:
    _check(lint.check_ruff)


def test_mypy_strict_floors_are_clean_and_the_rest_holds_its_baseline() -> None:
    _check(lint.check_mypy)


def test_the_baselines_name_only_the_ratcheted_rules_and_no_strict_floor() -> None:
    ruff = json.loads(lint.RUFF_BASELINE.read_text())
    assert {r for rules in ruff.values() for r in rules} <= set(lint.RATCHETED)
    assert all(n > 0 for rules in ruff.values() for n in rules.values())
    mypy = json.loads(lint.MYPY_BASELINE.read_text())
    assert not [f for f in mypy if f.startswith(lint.STRICT)] and all(n > 0 for n in mypy.values())
