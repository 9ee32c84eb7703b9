"""explore opens on a fact the finetune knows: with ``--run``, the run's test prompt on which SFT
ranks the answer best (then gives it the highest probability); without, the last demo's when the
loaded SFT is the demo's; otherwise the built-in prompt, said to be unchecked. The page and the
command line say where the example came from."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from weightgraft.explore.app import create_app
from weightgraft.explore.opening import DEFAULT, opening_example
from weightgraft.explore.session import Explorer

SERVED = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny position sweep (PRE, SFT, ...) on the tiny world."""
    from tiny_world import loader, tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    root = tmp_path_factory.mktemp("opening_run")
    run_experiment(parse_config(tiny_config(root, "pos", world={"n": 4})), load=loader, progress=False)
    return next(p.parent for p in root.rglob("summary.csv"))


def _best_sft_row(run_dir: Path) -> pd.Series:
    res = pd.read_parquet(run_dir / "results.parquet")
    sft = res[res.scheme == "SFT"]
    return sft.sort_values(["rank", "answer_logprob", "prob"], ascending=[True, False, False]).iloc[0]


@pytest.fixture()
def no_demo(tmp_path, monkeypatch):
    """No demo record and no runs/demo/run under the working directory."""
    monkeypatch.setenv("WEIGHTGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def test_with_a_run_it_opens_on_the_prompt_sft_knows_best(run_dir, no_demo):
    best = _best_sft_row(run_dir)
    res = pd.read_parquet(run_dir / "results.parquet")
    opening = opening_example(run_dir, "tiny-llama:sft")
    assert (opening.prompt, opening.answer) == (best.prompt, best.answer)
    assert opening.sft_prob == pytest.approx(float(best.prob)) and opening.sft_rank == int(best["rank"])
    assert opening.sft_answer_prob == pytest.approx(float(__import__("math").exp(best.answer_logprob)))
    # the best of all SFT rows: none ranks the answer better, or as well with a likelier whole answer
    sft = res[res.scheme == "SFT"]
    same = sft["rank"] == opening.sft_rank
    assert not ((sft["rank"] < opening.sft_rank) | (same & (sft.answer_logprob > best.answer_logprob + 1e-9))).any()
    assert opening.checked and (opening.prompt, opening.answer) != (DEFAULT.prompt, DEFAULT.answer)
    assert opening.spans and all(isinstance(v, list) for v in opening.spans.values())  # from the run's dataset
    line = opening.line()
    assert line.startswith(f"opening example: {best.prompt!r} -> {best.answer!r} from {run_dir} results (SFT ")
    assert f"p {float(best.prob):.3f}" in line and "\n" not in line
    assert opening_example(run_dir, "tiny-llama:sft") == opening  # the same choice every time
    # a run of another SFT than the one loaded: said
    other = opening_example(run_dir, "tiny-llama:task")
    assert other.prompt == opening.prompt and "that run's SFT was tiny-llama:sft" in other.line()


def test_the_page_opens_on_it(run_dir, no_demo, tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    explorer = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    opening = opening_example(run_dir, "tiny-llama:sft")
    info = TestClient(base_url=SERVED, app=create_app(explorer, opening=opening)).get("/api/info").json()
    assert info["opening"] == json.loads(json.dumps(opening.to_json()))
    assert info["opening"]["checked"] and info["opening"]["line"] == opening.line()
    # without a choice, the built-in prompt, said to be unchecked
    plain = TestClient(base_url=SERVED, app=create_app(explorer)).get("/api/info").json()["opening"]
    assert plain["prompt"] == DEFAULT.prompt and not plain["checked"] and "unchecked" in plain["line"]


def test_without_a_run_the_demos_results_serve_the_demos_sft_only(run_dir, tmp_path, no_demo, tiny_model_dirs):
    from weightgraft.models.demo_models import write_demo_record

    assert opening_example(None, "demo") == DEFAULT  # no demo: the built-in prompt
    assert "unchecked" in DEFAULT.line() and "--run" in DEFAULT.line()
    write_demo_record("smollm2-135m", tiny_model_dirs["sft"], run_dir)
    best = _best_sft_row(run_dir)
    for spec in ("demo", "demo:sft", str(tiny_model_dirs["sft"])):
        opening = opening_example(None, spec)
        assert opening.prompt == best.prompt and opening.checked
        assert f"from the demo's results ({run_dir.resolve()})" in opening.line()
    assert opening_example(None, str(tiny_model_dirs["pre"])) == DEFAULT  # not the demo's finetune


def test_a_run_without_sft_rows_opens_on_the_default_and_says_why(run_dir, tmp_path, no_demo):
    import shutil

    copy = tmp_path / "nosft"
    shutil.copytree(run_dir, copy)
    res = pd.read_parquet(copy / "results.parquet")
    res[res.scheme != "SFT"].to_parquet(copy / "results.parquet")
    opening = opening_example(copy, "tiny-llama:sft")
    assert opening.prompt == DEFAULT.prompt and not opening.checked
    assert f"--run {copy} has no SFT results" in opening.line()


def test_the_cli_says_where_the_opening_example_came_from(run_dir, no_demo, monkeypatch):
    from tiny_world import loader

    import weightgraft.explore.serve as serve
    import weightgraft.models as models
    from weightgraft.cli import app

    served = {}
    monkeypatch.setattr(models, "load_model", lambda spec, **kw: loader(spec))
    monkeypatch.setattr(serve, "serve", lambda application, host, port: served.update(app=application))
    res = CliRunner().invoke(app, ["explore", "-m", "pre=tiny-llama:pre", "-m", "sft=tiny-llama:sft", "--run", str(run_dir),
                                   "--port", "0"])
    assert res.exit_code == 0, res.output
    best = _best_sft_row(run_dir)
    assert f"opening example: {best.prompt!r} -> {best.answer!r} from {run_dir} results (SFT " in res.output
    assert "app" in served  # then served, on that example


@pytest.mark.slow
def test_the_browser_page_fills_its_inputs_with_the_opening(run_dir, no_demo, tiny_pair, tiny_tok):
    import browser as browser_env

    from weightgraft.explore.serve import free_port

    chromium = browser_env.chromium()
    from playwright.sync_api import sync_playwright

    pre, sft = tiny_pair("llama")
    opening = opening_example(run_dir, "tiny-llama:sft")
    port = free_port()
    app = create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok), address=("127.0.0.1", port), opening=opening)
    with browser_env.served(app, port) as url:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=browser_env.FLAGS)
            page = browser.new_page()
            page.goto(url)
            page.wait_for_selector("body[data-ready]", timeout=30000)
            assert page.input_value("#prompt") == opening.prompt
            assert page.input_value("#answer") == opening.answer
            assert page.text_content("#opening") == opening.line()
            assert page.text_content("#error") == ""  # its spans are the dataset's, accepted as they are
            browser.close()
