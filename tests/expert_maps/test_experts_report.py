"""The expert map's report page: ``weightgraft experts`` writes it, ``weightgraft report DIR``
writes it again from the folder alone, and a folder without a control renders without its column."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from weightgraft.cli import app
from weightgraft.report.experts import write_experts_report

FIGURES = {f"experts_{t}_{r}.png" for t in ("headline", "qa") for r in ("first_entity", "last")}


def _copy(folder: Path, to: Path) -> Path:
    return Path(shutil.copytree(folder, to, ignore=shutil.ignore_patterns("report")))


def _headers(page: str) -> list[str]:
    return re.findall(r"<th>([^<]*)</th>", page)


def test_the_command_writes_the_page_with_maps_and_tables(experts_out):
    report = experts_out / "report"
    page = (report / "index.html").read_text()
    assert {p.name for p in report.glob("*.png")} == FIGURES
    assert page.count('<img src="data:image/png;base64,') == len(FIGURES)
    for heading in ("Expert maps", "Region grafts", "Top cells", "Concentration", "Manifest"):
        assert f"<h2>{heading}</h2>" in page
    assert "grafted alone into PRE" in page and "exact zeros, measured, not estimated" in page
    headers = _headers(page)
    assert "sft: mean [95% t interval]" in headers and "control: mean [95% t interval]" in headers
    assert {f"{g}: mean [95% t interval]" for g in ("experts", "router", "moe", "all")} <= set(headers)
    manifest = json.loads((experts_out / "manifest.json").read_text())
    for role in ("pre", "sft", "control"):
        assert manifest["models"][role]["weights_sha256"] in page  # the whole hash, as the cell's tooltip
    assert manifest["versions"]["torch"] in page and "headline: 6, qa: 6" in page
    top = pd.read_csv(experts_out / "top_cells.csv")
    assert (top["pick_rate"] == 0).sum() == page.count("0 (never picked: exact)") / 2  # sft's and control's


def test_report_writes_the_experts_page_again_from_the_folder(experts_out, tmp_path):
    folder = _copy(experts_out, tmp_path / "experts")
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    page = folder / "report" / "index.html"
    assert page.is_file() and {p.name for p in page.parent.glob("*.png")} == FIGURES
    assert _headers(page.read_text()) == _headers((experts_out / "report" / "index.html").read_text())
    elsewhere = tmp_path / "elsewhere"
    assert CliRunner().invoke(app, ["report", str(folder), "--out", str(elsewhere)]).exit_code == 0
    assert (elsewhere / "index.html").is_file()


def test_a_folder_without_a_control_renders_without_its_column(experts_out, tmp_path):
    folder = _copy(experts_out, tmp_path / "alone")
    for name in ("experts.csv", "regions.csv", "concentration.csv"):
        table = pd.read_csv(folder / name)
        table[table["model"] != "control"].to_csv(folder / name, index=False)
    top = pd.read_csv(folder / "top_cells.csv")
    top[[c for c in top.columns if not c.endswith("[control]")]].to_csv(folder / "top_cells.csv", index=False)
    cells = pd.read_parquet(folder / "expert_cells.parquet")
    cells[cells["model"] != "control"].to_parquet(folder / "expert_cells.parquet", index=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["donors"].pop("control")
    manifest["models"].pop("control")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    page = write_experts_report(folder).read_text()
    headers = _headers(page)
    assert "sft: mean [95% t interval]" in headers and not any(h.startswith("control") for h in headers)
    assert "no control finetune was mapped" in page and "layer x expert, sft (" in page
    assert "control:" not in page and page.count('<img src="data:image/png;base64,') == len(FIGURES)
