"""The explore page in headless Chromium (Debian's ``chromium`` through playwright) on tiny
models: a painted cell moves the top-k to what ``wg.graft`` computes, and paint stays on its
token when the prompt is edited. Skipped, with one line, where no browser is installed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser as browser_env
import pytest

import weightgraft as wg
from weightgraft.explore.app import create_app
from weightgraft.explore.artifacts import LocalizeView, RunView
from weightgraft.explore.serve import free_port
from weightgraft.explore.session import Explorer

pytestmark = pytest.mark.slow  # `make check` leaves these out: headless Chromium

PROMPT = "Keanu Reeves starred in a movie with"


def _playwright() -> Any:
    from playwright.sync_api import sync_playwright  # a test dependency: pip install -e '.[test]'

    browser_env.chromium()
    return sync_playwright


# a localize directory holding one found set of a head and a neuron (its exactness through the
# API: test_explore_units.py); no cell rows, so no heat map is drawn under the grids
UNIT_SET = [{"position_label": "last", "slot": "layers.0.o/h1"}, {"position_label": "last", "slot": "layers.3.up/n5"}]


def _unit_set_dir(root: Path) -> Path:
    import pandas as pd

    columns = ["model", "direction", "template", "example_id", "position", "position_label", "slot", "unit", "estimate"]
    pd.DataFrame({c: pd.Series(dtype="int64" if c in ("position", "unit") else "float64" if c == "estimate" else "object")
                  for c in columns}).to_parquet(root / "cells.parquet")
    (root / "search.json").write_text(json.dumps({"metric": "logprob", "searches": [
        {"direction": "sufficiency", "template": "headline", "size": 2, "share": 0.5, "cells": UNIT_SET}]}))
    return root


def _authors_run(root: Path) -> Path:
    """A tiny position sweep computed under protocol ``authors`` (its rows switch the page's protocol)."""
    from tiny_world import loader, tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    run_experiment(parse_config(tiny_config(root, "authors", world={"n": 2}, protocol="authors")), load=loader, progress=False)
    return next(p.parent for p in root.rglob("summary.csv"))


@pytest.fixture(scope="module")
def served(tiny_pair, tiny_tok, tmp_path_factory) -> Iterator[tuple[str, Any, Any, Any]]:

    sync_playwright = _playwright()
    pre, sft = tiny_pair("llama")
    port = free_port()
    localize = LocalizeView(_unit_set_dir(tmp_path_factory.mktemp("unit_set")))
    run = RunView(_authors_run(tmp_path_factory.mktemp("authors_run")))
    app = create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok), run, localize, address=("127.0.0.1", port))
    with browser_env.served(app, port) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_env.chromium(), args=browser_env.FLAGS)
        yield url, browser, pre, sft
        browser.close()


@pytest.fixture()
def page(served):
    url, browser, _, _ = served
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=30000)
    yield page
    assert not errors, errors
    page.close()


def _settle(page, before: str | None = None) -> str:
    """Wait for a graft newer than ``before`` and the debounced typing to settle."""
    if before is not None:
        page.wait_for_function(f"() => document.body.dataset.ready !== '{before}'", timeout=30000)
    page.wait_for_timeout(700)
    return page.eval_on_selector("body", "b => b.dataset.ready")


def _painted_positions(page) -> list[int]:
    """Positions whose layer-0 cell of the first grid has a slot from SFT (its title says so)."""
    return page.eval_on_selector_all(
        "#grids .block:first-child .grid:not(.heat) .c",
        """cells => { const bottom = Math.max(...cells.map((c) => +c.dataset.row));
           return cells.filter((c) => +c.dataset.row === bottom && c.title.includes('=sft')).map((c) => +c.dataset.t); }""")


def test_page_paints_a_cell_and_the_top_k_moves(served, page, tiny_tok):
    _, _, pre, sft = served
    page.fill("#prompt", PROMPT)
    page.fill("#spans", "first_actor=Keanu Reeves")
    page.fill("#answer", "Tom")
    seq = _settle(page)
    before = page.inner_text("#top [data-model=graft]")
    assert before.splitlines()[1:] == page.inner_text("#top [data-model=pre]").splitlines()[1:]  # nothing painted
    assert "protocol paper" in page.inner_text("#protocol-line")
    page.locator("#grids .block").first.locator(".grid:not(.heat) .c").last.click()  # layer 0, last token
    _settle(page, seq)
    after = page.inner_text("#top [data-model=graft]")
    assert after.splitlines()[1:] != before.splitlines()[1:]
    last = len(tiny_tok(PROMPT)["input_ids"]) - 1
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [PROMPT], wg.Rule(
        model="sft", positions=str(last), layers="0", components="attn"))
    first = out.top(1)[0][0][0]
    assert after.splitlines()[1].startswith(first.replace(" ", "␣")) or first.strip() in after.splitlines()[1]
    page.click("#position-schemes button:text-is('FE+LT')")
    page.wait_for_function("() => document.querySelector('button.scheme.on') !== null")


def test_paint_stays_on_its_token_when_the_prompt_is_edited(page, tiny_tok):
    page.fill("#prompt", PROMPT)
    page.fill("#spans", "")
    seq = _settle(page)
    n = len(tiny_tok(PROMPT)["input_ids"])
    page.locator("#grids .block").first.locator(f".grid:not(.heat) .c[data-t='{n - 1}']").last.click()
    seq = _settle(page, seq)
    assert _painted_positions(page) == [n - 1]
    shown = page.inner_text("#top [data-model=graft]")
    page.locator("#prompt").press("Home")
    page.locator("#prompt").type("Yesterday, ")  # typed, as a user types: every keystroke re-tokenizes
    _settle(page, seq)
    m = len(tiny_tok("Yesterday, " + PROMPT)["input_ids"])
    # the paint is on the same token (the prompt's last), not on position n - 1, which is now another character
    assert _painted_positions(page) == [m - 1]
    assert "paint kept on its token" in page.inner_text("#notice")
    assert page.inner_text("#top [data-model=graft]") != "" and shown


def test_a_set_of_heads_and_neurons_paints_cells_partly(served, page, tiny_tok):
    import torch

    from weightgraft.engine.reference import per_token_forward
    from weightgraft.engine.source_map import SourceMap

    _, _, pre, sft = served
    page.fill("#prompt", PROMPT)
    page.fill("#spans", "")
    seq = _settle(page)
    page.click("#localize button:has-text('minimal set')")
    seq = _settle(page, seq)
    assert "applied by unit" in page.inner_text("#graft-line")
    n = len(tiny_tok(PROMPT)["input_ids"])
    o_grid = page.locator("#grids .block").nth(1).locator(".grid:not(.heat)")  # attention output o
    cell = o_grid.locator(f".c[data-t='{n - 1}']").last  # layer 0 (rows: last layer at the top)
    assert "partial" in cell.get_attribute("class") and cell.get_attribute("data-units") == "1/4"
    assert "layers.0.o: 3 of 4 heads from pre, 1 head from sft" in cell.get_attribute("title")
    # the grafted column is the per-token definition of grafting that head and that neuron
    ids = torch.tensor([tiny_tok(PROMPT)["input_ids"]])
    source = torch.zeros(1, n, len(wg.slots(pre)), dtype=torch.long)
    heads = torch.zeros(1, n, 4, dtype=torch.long)
    heads[0, -1, 1] = 1
    neurons = torch.zeros(1, n, pre.config.intermediate_size, dtype=torch.long)
    neurons[0, -1, 5] = 1
    maps = SourceMap(source, {"layers.0.o": heads}, {"layers.3.up": neurons})
    logits = per_token_forward([pre, sft], ids, maps)[0, -1]
    top = tiny_tok.decode([int(logits.argmax())])
    first = page.locator("#top [data-model=graft] .entry").first
    assert first.locator(".t").inner_text() == top.replace(" ", "␣")
    assert first.locator(".p").inner_text() == f"{100 * float(torch.softmax(logits, -1).max()):.1f}%"
    # the null: PRE's column (nothing grafted) shows another first token here
    assert page.locator("#top [data-model=pre] .entry").first.locator(".t").inner_text() != top.replace(" ", "␣")
    # the units stay on their token when the prompt is edited
    page.locator("#prompt").press("Home")
    page.locator("#prompt").type("So ")
    _settle(page, seq)
    m = len(tiny_tok("So " + PROMPT)["input_ids"])
    assert o_grid.locator(f".c[data-t='{m - 1}']").last.get_attribute("data-units") == "1/4"
    assert "applied by unit" in page.inner_text("#graft-line")


def test_a_run_row_switches_the_protocol_and_says_so(page):
    """The run was computed under ``authors``: its row opens under ``authors``, the line beside
    the result says the row switched it and gives the way back, which restores ``paper``."""
    assert page.input_value("#protocol") == "paper"
    seq = page.eval_on_selector("body", "b => b.dataset.ready")
    page.locator("#run tr.row").first.click()
    _settle(page, seq)
    line = page.inner_text("#protocol-line")
    assert "protocol authors" in line and "switched by the run row" in line
    assert page.input_value("#protocol") == "authors"
    seq = page.eval_on_selector("body", "b => b.dataset.ready")
    page.click("#protocol-line button:text-is('back to paper')")
    _settle(page, seq)
    assert page.input_value("#protocol") == "paper"
    assert "protocol paper" in page.inner_text("#protocol-line") and "switched" not in page.inner_text("#protocol-line")


def test_a_rule_s_scale_input_travels_with_the_rule(served, page, tiny_tok):
    """A scheme's rules each get a scale input (1 until changed): 2 on the first grafts what
    ``wg.graft`` grafts with ``Rule(scale=2)``, and the scale stays when the prompt is edited."""
    import torch

    _, _, pre, sft = served
    page.fill("#prompt", PROMPT)
    page.fill("#spans", "first_actor=Keanu Reeves")
    seq = _settle(page)
    assert page.locator("#rules").is_hidden()
    button = page.locator("#position-schemes button:text-is('FE+LT')")
    rules = json.loads(button.get_attribute("data-rules"))
    button.click()
    seq = _settle(page, seq)
    scales = page.locator("#rules input.scale")
    assert scales.count() == len(rules) and scales.first.input_value() == "1"
    scales.first.fill("2")
    seq = _settle(page, seq)
    assert "scaled(sft, 2)" in page.inner_text("#legend")

    def shown_is_wg_graft(prompt: str) -> None:
        rows = [wg.Rule(**{**rules[0], "scale": 2}), *(wg.Rule(**r) for r in rules[1:])]
        out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, [prompt], rows, spans=[{"first_actor": "Keanu Reeves"}])
        first = page.locator("#top [data-model=graft] .entry").first
        assert first.locator(".p").inner_text() == f"{100 * float(torch.softmax(out.logits[0], -1).max()):.1f}%"
        assert first.locator(".t").inner_text() == out.top(1)[0][0][0].replace(" ", "␣")

    shown_is_wg_graft(PROMPT)
    page.locator("#prompt").press("Home")
    page.locator("#prompt").type("So ")
    _settle(page, seq)
    assert page.locator("#rules input.scale").first.input_value() == "2"
    shown_is_wg_graft("So " + PROMPT)


def test_the_moe_page_paints_single_experts_and_clicks_the_expert_map(served, experts_out, moe_dirs):
    """On a tiny Mixtral with its expert map (--experts): the router and experts grids are drawn,
    a stroke with the experts list "2" paints expert 2 alone (its cell partly filled, the request
    a ``/e2`` cell), and a click on a map cell grafts that expert at that region as a rule."""
    from weightgraft.explore.expert_view import ExpertMapView
    from weightgraft.models import load_model

    browser = served[1]  # the module's browser (one playwright per thread)
    loaded = {r: load_model(moe_dirs[r]) for r in ("pre", "sft")}
    port = free_port()
    app = create_app(Explorer({r: lm.model for r, lm in loaded.items()}, loaded["pre"].tokenizer),
                     address=("127.0.0.1", port), experts=ExpertMapView(experts_out))
    with browser_env.served(app, port) as url:
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        sent: list[dict] = []
        page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/api/graft") else None)
        page.goto(url)
        page.wait_for_selector("body[data-ready]", timeout=30000)
        titles = page.eval_on_selector_all("#grids h3", "hs => hs.map((h) => h.textContent)")
        assert any(t.startswith("MoE router") for t in titles) and any(t.startswith("MoE experts") for t in titles)
        seq = _settle(page)
        page.fill("#experts-list", "2")
        experts_grid = page.locator("#grids .block").filter(has_text="MoE experts").locator(".grid:not(.heat) .c")
        experts_grid.first.click()  # the top row (the last layer), the first token
        seq = _settle(page, seq)
        assert any(c["slot"].endswith("/e2") for c in sent[-1].get("cells", [])), sent[-1]
        assert experts_grid.first.get_attribute("data-units") == "1/4"
        page.fill("#experts-list", "9")
        experts_grid.nth(1).click()
        assert "no 9" in page.inner_text("#error")
        cell = page.locator("#experts table.emap td.v").first  # the first region's last layer, expert 0
        assert "mean first_logprob effect" in cell.get_attribute("title")
        cell.click()
        _settle(page, seq)
        rule = sent[-1]["rules"][0]
        assert rule["components"] == "experts" and rule["experts"] == "0" and rule["model"] == "sft"
        assert "experts 0" in page.inner_text("#rules") and page.inner_text("#error") == ""
        page.close()
    assert not errors, errors
