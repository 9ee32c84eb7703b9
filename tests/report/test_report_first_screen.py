"""The run report opens with its result: the config's name as title, the scheme names it uses
defined in one line, the summary table on the first screen of a 1280x900 window with nothing
wider than the window, and provenance (models, hashes, versions) after it. Checked in headless
Chromium (Debian's ``chromium`` through playwright; skipped, with one line, where no browser is
installed) on the report of a tiny run."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import browser as browser_env
import pandas as pd
import pytest

from weightgraft.report import write_report
from weightgraft.report.run import Run, report_title
from weightgraft.schemes.families import presets
from weightgraft.schemes.legend import ABBREVIATIONS, abbreviations_in, legend
from weightgraft.schemes.protocol import PROTOCOLS

WIDTH, HEIGHT = 1280, 900
NAME = "position-sweep-tiny"


def _playwright() -> Any:
    from playwright.sync_api import sync_playwright  # a test dependency: pip install -e '.[test]'

    browser_env.chromium()
    return sync_playwright


def _long_loader(spec: str, config: object = None) -> Any:
    """The tiny world's models, recorded with a real-length sha256 and a long cache path (what
    pushed the old page wider than the window)."""
    from tiny_world import loader

    out = loader(spec, config)
    out.weights_sha256 = hashlib.sha256(spec.encode()).hexdigest()
    out.source = "/home/someone/.cache/huggingface/hub/models--tiny/snapshots/" + "0123456789abcdef" * 3
    return out


SLOW_FIXTURES = ("report",)  # its tests are `slow` (tests/conftest.py): a tiny run and its report


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    from tiny_world import tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    root = tmp_path_factory.mktemp("first_screen")
    config = parse_config(tiny_config(root, NAME, world={"n": 3}, report=False))
    result = run_experiment(config, load=_long_loader, progress=False)
    assert result.run_dir.name == "run"  # the folder's name is not the title
    return write_report(result.run_dir, max_examples=2).html


def test_the_page_opens_with_the_configs_name_the_legend_and_the_summary(report):
    page = report.read_text(encoding="utf-8")
    assert f"<h1>{NAME}</h1>" in page and f"<title>{NAME}: weightgraft report</title>" in page
    assert "report: run" not in page
    legend_line = page[page.index('<p class="legend"'):]
    legend_line = legend_line[:legend_line.index("</p>")]
    for abbr, meaning in (("FE", "first entity"), ("LT", "last token"), ("^C", "complement"),
                          ("+", "union"), ("PRE", "pretrained model"), ("SFT", "finetuned model")):
        assert f"<b>{abbr}</b> = {meaning}" in legend_line, abbr
    assert "MOVIE" not in legend_line and "ATTN" not in legend_line  # only names the run used
    order = [page.index(s) for s in ('<p class="legend"', 'id="summary"', "<h2>Figures</h2>", 'id="provenance"')]
    assert order == sorted(order)
    digest = hashlib.sha256(b"tiny-llama:sft").hexdigest()
    assert f'title="{digest}">{digest[:12]}…</code>' in page and f">{digest}<" not in page
    md = (report.parent / "summary.md").read_text(encoding="utf-8")
    assert md.startswith(f"# {NAME}: weightgraft report") and "`FE` = first entity" in md


def test_title_falls_back_to_the_folder_only_where_the_config_names_none():
    def run(manifest: dict) -> Run:
        return Run(Path("runs/sweep-7"), pd.DataFrame(), pd.DataFrame(), manifest, {})

    assert report_title(run({"config": {"name": "heads-o-last-quarter"}})) == "heads-o-last-quarter"
    assert report_title(run({"config": {"name": "experiment"}})) == "sweep-7"  # the unset default
    assert report_title(run({})) == "sweep-7"


def test_legend_lists_known_abbreviations_in_table_order():
    got = legend(["PRE", "(FE+LT)^C", "my-scheme", "Output", "O+FFN-UP@last_half"])
    assert [abbr for abbr, _ in got] == ["PRE", "FE", "LT", "O", "FFN-UP", "^C", "+", "@"]
    assert legend(["my-scheme", "Output", "dropout0.25#1"]) == []


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_every_preset_scheme_name_is_written_with_defined_abbreviations(protocol):
    params = {"heads": {"n_heads": 2}}
    for name, family in presets().items():
        schemes = family.builder(protocol)(**params.get(name, {}))
        for scheme in schemes:
            unknown = [t for t in abbreviations_in(scheme.name) if t not in ABBREVIATIONS]
            assert not unknown, (name, scheme.name, unknown)


def test_first_screen_in_chromium_at_1280x900(report, tmp_path):
    sync_playwright = _playwright()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_env.chromium(), args=browser_env.FLAGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.goto(report.as_uri())
            geometry = page.evaluate("""() => {
                const box = (el) => { const r = el.getBoundingClientRect(); return [r.top, r.right, r.bottom]; };
                return {scrollWidth: document.documentElement.scrollWidth,
                        title: document.title, h1: document.querySelector('h1').textContent,
                        legend: document.querySelector('#legend').textContent,
                        table: box(document.querySelector('#summary table')),
                        provenance: box(document.querySelector('#provenance'))};
            }""")
            shot = tmp_path / "first-screen.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert geometry["scrollWidth"] <= WIDTH  # no horizontal scrollbar, hash column included
    top, right, _ = geometry["table"]
    assert 0 < top < HEIGHT and right <= WIDTH  # the summary table starts on the first screen
    assert geometry["provenance"][0] > geometry["table"][2]  # provenance below the summary
    assert geometry["h1"] == NAME and geometry["title"].startswith(NAME)
    assert "FE = first entity" in geometry["legend"] and "LT = last token" in geometry["legend"]
    from PIL import Image

    width, height = Image.open(shot).size
    assert width == WIDTH and height > HEIGHT  # the whole page is one window wide
