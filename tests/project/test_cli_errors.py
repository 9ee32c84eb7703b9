"""What the ``weightgraft`` command prints when something goes wrong: the user's mistake is one
red line; a bug in weightgraft keeps its traceback and says it is a bug, with the version."""

from __future__ import annotations

import sys

import pytest

import weightgraft
from weightgraft.cli import main
from weightgraft.errors import WeightgraftError


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.delenv("WEIGHTGRAFT_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["weightgraft", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_every_error_class_has_the_root_and_keeps_its_builtin_base():
    from weightgraft.data.errors import TemplateFieldError
    from weightgraft.experiments.config import ConfigError
    from weightgraft.experiments.store import ResultsWriteError
    from weightgraft.models.errors import ModelNotFoundError
    from weightgraft.schemes.binding import GraftInputError
    from weightgraft.schemes.selectors import SpanNotFound

    for cls, builtin in ((GraftInputError, ValueError), (TemplateFieldError, ValueError), (ConfigError, ValueError),
                         (ResultsWriteError, OSError), (ModelNotFoundError, FileNotFoundError),
                         (ModelNotFoundError, RuntimeError), (SpanNotFound, LookupError)):
        assert issubclass(cls, WeightgraftError) and issubclass(cls, builtin), cls
    assert weightgraft.WeightgraftError is WeightgraftError


def test_a_user_error_is_one_line(tmp_path, monkeypatch, capsys):
    code, err = _main(monkeypatch, capsys, "run", str(tmp_path / "missing.yaml"))
    assert code == 2
    assert _lines(err) == [f"error: ConfigError: experiment config {tmp_path / 'missing.yaml'} does not exist"]


def test_an_oserror_naming_a_path_is_one_line(tmp_path, monkeypatch, capsys):
    import weightgraft.experiments.config as config_mod

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "exp.yaml"))

    monkeypatch.setattr(config_mod, "load_config", unreadable)
    code, err = _main(monkeypatch, capsys, "run", str(tmp_path / "exp.yaml"))
    assert code == 2 and len(_lines(err)) == 1 and "Traceback" not in err
    assert "Permission denied" in err and "exp.yaml" in err


@pytest.mark.parametrize("planted", [TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
                                     ValueError("too many values to unpack"), OSError("no path here")])
def test_a_bug_prints_its_traceback_and_says_it_is_a_bug(tmp_path, monkeypatch, capsys, planted):
    """A TypeError (or a bare ValueError, or an OSError naming no path) raised inside our code is
    not the user's mistake: the traceback stays, and one line names it a bug and the version."""
    import weightgraft.experiments.config as config_mod

    def broken(*args, **kwargs):
        raise planted

    monkeypatch.setattr(config_mod, "load_config", broken)
    code, err = _main(monkeypatch, capsys, "run", str(tmp_path / "exp.yaml"))
    assert code == 1
    assert "Traceback (most recent call last)" in err and "in broken" in err  # where it was raised
    assert f"{type(planted).__name__}: {planted}" in err
    assert f"bug in weightgraft {weightgraft.__version__}" in " ".join(err.split())
    assert not err.lstrip().startswith("error:")


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIGHTGRAFT_DEBUG", "1")
    monkeypatch.setattr(sys, "argv", ["weightgraft", "run", str(tmp_path / "missing.yaml")])
    from weightgraft.experiments.config import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        main()


def test_a_usage_error_is_still_clicks(monkeypatch, capsys):
    code, err = _main(monkeypatch, capsys, "run", "--no-such-flag")
    assert code == 2 and "No such option" in err and "Traceback" not in err
