"""What the library needs is installed with it; explore's web server and the worlds' fake-name
generator are extras (``weightgraft[explore]``, ``weightgraft[worlds]``) that the README's
commands install: without them the command that needs one says so in one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def test_the_extras_hold_the_server_and_faker_and_the_test_install_has_them() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert not any(name in core for name in ("starlette", "uvicorn", "faker"))
    extras = project["optional-dependencies"]
    assert {d.split(">")[0] for d in extras["explore"]} == {"starlette", "uvicorn"}
    assert {d.split(">")[0] for d in extras["worlds"]} == {"Faker"}
    assert set(extras["explore"]) | set(extras["worlds"]) <= set(extras["test"])  # `make test` / `make demo`
    assert '-e ".[test]"' in (ROOT / "Makefile").read_text()


def test_explore_without_its_extra_is_one_line(monkeypatch) -> None:
    from weightgraft.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "starlette" else real(name, *a))
    out = CliRunner().invoke(app, ["explore", "-m", "pre=a", "-m", "sft=b"])
    assert out.exit_code == 2 and "weightgraft[explore]" in out.output and "Traceback" not in out.output


def test_a_world_without_faker_is_one_line(monkeypatch) -> None:
    from weightgraft.data.errors import DataError
    from weightgraft.data.sampling import FakeSource

    monkeypatch.setitem(sys.modules, "faker", None)  # import faker raises ImportError
    with pytest.raises(DataError, match=r"pip install 'weightgraft\[worlds\]'"):
        FakeSource(0)
