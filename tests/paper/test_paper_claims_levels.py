"""The paper report's claims table prints each row's interval with its own level (``ci_level``,
kept from claims.csv): 99% where skew widened it, 95% otherwise, and "level not recorded" for a
claims record written before the column, never an assumed 95%."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from weightgraft.paper.claims import CLAIM_COLUMNS, claim_rows
from weightgraft.paper.page import to_markdown
from weightgraft.paper.report_claims import claims_blocks
from weightgraft.paper.stages import ClaimsOutputs, ClaimsRecord


def _row(claim: str, level: float | None) -> dict:
    row = {"model": "sft", "setting": "pre->sft", "template": "paper_headline", "claim": claim, "statement": "s",
           "n_prompts": 40, "evidence": "confirmatory", "share_exact": 0.88, "ci_low": 0.79, "ci_high": 0.96,
           "threshold": 0.5, "side": ">", "null_kind": "complement", "p_holm": 0.001, "family_size": 2,
           "least_p": 0.0001, "verdict": "holds", "reason": "", "in_paper_setting": True}
    return row if level is None else {**row, "ci_level": level}


def _page(rows: list[dict]) -> str:
    """The claims section of paper.md for a one-seed run whose claims record holds ``rows``."""
    run = SimpleNamespace(settings=SimpleNamespace(claims=True, seeds=1, train_seed=0), skipped={},
                          claims=ClaimsRecord(outputs=ClaimsOutputs(claims=rows)),
                          by_seed=lambda: {0: SimpleNamespace(finetunes={})})
    return to_markdown(claims_blocks(run))


def test_the_claims_table_prints_each_rows_level():
    page = _page([_row("fe_lt", 0.95), _row("enrichment", 1 - 0.05 / 5)])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines() if line.startswith("| ")}
    assert "0.88 [0.79, 0.96] (95%)" in lines["fe_lt"] and "0.88 [0.79, 0.96] (99%)" in lines["enrichment"]
    assert "[95% CI]" not in page


def test_an_old_claims_record_without_the_level_says_so():
    page = _page([_row("fe_lt", None)])
    assert "0.88 [0.79, 0.96] (level not recorded)" in page and "(95%)" not in page


def test_the_report_keeps_the_level_of_each_claims_row():
    assert "ci_level" in CLAIM_COLUMNS
    table = pd.DataFrame([_row("fe_lt", 0.99), _row("recall", float("nan"))])
    kept = claim_rows(table)
    assert kept[0]["ci_level"] == pytest.approx(0.99) and kept[1]["ci_level"] is None  # NaN -> None: "level not recorded"
