"""The localize report of a tiny run: what the page says, and a screenshot in a real browser
(headless chromium; skipped with the reason printed where it is not installed)."""

from __future__ import annotations

import subprocess

import pytest
from browser import chromium
from tiny_world import loader, write_world

from weightgraft.api.localize import localize
from weightgraft.localization.config import parse_localize_config

pytestmark = pytest.mark.slow  # `make check` leaves these out: localize end to end, and headless Chromium


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    raw = {"name": "tiny-report", "data": str(write_world(tmp / "data", n=4)), "out": str(tmp / "run"),
           "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"}, "exact": 1, "batch_size": 3,
           "exact_chunk": 64, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"controls": 20, "missed_sample": 8}}
    result = localize(parse_localize_config(raw), progress=False, load=loader)
    assert result.report == result.run_dir / "report" / "index.html"
    return result.report


def test_report_has_a_header_controls_and_the_global_slots(page):
    text = page.read_text()
    for what in ("tiny-llama:pre", "tiny-llama:sft", "metric", "logprob", "prompts per template", "headline: 4",
                 "prompt directions", "a2b", "Found sets", "random controls", "matched controls", "refined",
                 "What the ranking missed", "cells each prompt received"):
        assert what in text, what
    assert text.count("data:image/png;base64,") >= 8  # self-contained, like the run report
    assert "font-family:system-ui" in text  # the run report's style


def test_the_claims_are_written_as_a_docs_block_beside_the_page(page):
    from weightgraft.localization.claims import RULES_VERSION
    from weightgraft.report.blocks import generated_blocks

    (block,) = generated_blocks((page.parent / "claims.md").read_text())
    assert (block.name, block.rules) == ("localize-tiny-report", RULES_VERSION)
    assert "| donor | setting | template | claim |" in block.body and "fe_lt" in block.body


def test_heatmaps_include_embed_final_norm_and_unembed(page):
    import pandas as pd

    from weightgraft.report import localize_figures as figs

    cells = pd.read_parquet(page.parent.parent / "cells.parquet")
    sub = cells[(cells["direction"] == "sufficiency") & (cells["template"] == "headline")]
    grid = figs.global_grid(sub, "estimate")
    assert list(grid.columns) == ["embed", "final_norm", "unembed"]
    assert grid["embed"].notna().all()
    assert list(grid.index[grid["unembed"].notna()]) == ["last"] == list(grid.index[grid["final_norm"].notna()])
    last = sub[(sub["position_label"] == "last") & (sub["component"] == "unembed")]["estimate"].mean()
    assert grid.loc["last", "unembed"] == pytest.approx(last)
    panels = figs.heatmaps(sub, "estimate", "t", page.parent / "check.png")
    assert panels[-1] == "embed / final_norm / unembed" and "o" in panels


def test_screenshot_in_a_real_browser(page, tmp_path):
    browser = chromium()
    shot = tmp_path / "localize.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1400,2400", page.as_uri()], capture_output=True, timeout=180, check=False)
    assert shot.is_file() and shot.stat().st_size > 10_000
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 2400)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, tables and heatmaps, not a blank page
    reds = sum(n for n, (r, g, b) in colours if r > 150 and g < 120 and b < 120)
    blues = sum(n for n, (r, g, b) in colours if b > 150 and r < 120)
    assert reds > 100 and blues > 100  # the heatmaps were drawn on the page
