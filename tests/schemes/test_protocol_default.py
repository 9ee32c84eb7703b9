"""One grafting protocol by default everywhere (API, configs, CLI, explore), and the active one
named wherever numbers are shown: every summary table's title, ``GraftOutput``'s repr, the
run report's headers, ``weightgraft generate``."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest
import yaml
from rich.console import Console
from tiny_world import tiny_config
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli import app
from weightgraft.experiments.config import ExperimentConfig
from weightgraft.explore.requests import GraftRequest
from weightgraft.report.console import print_summary
from weightgraft.schemes.presets import preset
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, PROTOCOLS
from weightgraft.schemes.scheme import compile_scheme

PROMPTS = ["Keanu Reeves starred in a movie with", "Q: Who starred in a movie alongside Tom Hanks? A: An actor named"]


def test_one_default_everywhere():
    assert DEFAULT_PROTOCOL in PROTOCOLS
    functions = [wg.graft, wg.compare, wg.explain, wg.generate, wg.grafted, preset, compile_scheme]
    defaults = {f.__name__: inspect.signature(f).parameters["protocol"].default for f in functions}
    defaults["config"] = ExperimentConfig.model_fields["protocol"].default
    defaults["explore"] = GraftRequest.model_fields["protocol"].default
    assert set(defaults.values()) == {DEFAULT_PROTOCOL}, defaults


def test_the_readme_first_screen_names_the_default():
    from pathlib import Path

    first_screen = "\n".join((Path(__file__).parents[2] / "README.md").read_text().splitlines()[:40])
    assert f"`protocol: {DEFAULT_PROTOCOL}`" in first_screen


@pytest.mark.parametrize("protocol", ["paper", "authors"])
def test_graft_output_names_its_protocol(tiny_pair, tiny_tok, protocol):
    pre, sft = tiny_pair("llama")
    rule = wg.Rule(model="sft", positions="last", components="o+ffn")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, rule, protocol=protocol)
    assert out.protocol == protocol and f"protocol={protocol}" in repr(out)
    other = next(p for p in PROTOCOLS if p != protocol)
    assert f"protocol={other}" not in repr(out)


def _summary() -> pd.DataFrame:
    return pd.DataFrame([{"model_set": "m", "template": "t", "direction": "a2b", "scheme": "LT", "n": 4,
                          "top1": 0.5, "top5": 1.0, "mean_rank": 0.5}])


@pytest.mark.parametrize("protocol", ["paper", "authors"])
def test_summary_table_title_names_the_protocol(protocol):
    console = Console(width=80, record=True)
    print_summary(_summary(), protocol=protocol, title="demo", console=console)
    title = console.export_text().splitlines()[0]
    assert f"protocol {protocol}" in title and "protocol" not in title.replace(f"protocol {protocol}", "")


def test_run_table_report_and_generate_name_the_configs_protocol(tmp_path, world_model_dirs):
    raw = tiny_config(tmp_path, "proto", models=world_model_dirs, protocol="authors", limit=2,
                      schemes=[{"preset": "position", "only": ["PRE", "SFT", "LT"]}])
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path), "templates=[headline]", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "protocol authors" in " ".join(result.output.split())
    assert "Protocol: authors" in (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "protocol: <b>authors</b>" in (tmp_path / "run" / "report" / "report.html").read_text()
    gen = CliRunner().invoke(app, ["generate", "Keanu Reeves starred in a movie with", "--config", str(path),
                                   "--scheme", "LT", "-n", "2"])
    assert gen.exit_code == 0, gen.output
    assert "protocol authors\nLT: Keanu" in gen.output  # (loading bars on stderr come before)
