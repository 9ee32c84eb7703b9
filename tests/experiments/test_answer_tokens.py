"""Answers scored on a token that means little (issue 40): every row says how it was scored,
a first token shared with other answers or under 3 characters is flagged and counted, the
report and console put whole-answer recovery beside first-token recovery, and a distractor
logit difference between first tokens that begin each other's names is refused."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from rich.console import Console
from tiny_world import loader

from weightgraft.experiments.answer_tokens import add_answer_flags, distractor_flag, logit_diff_note
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.experiments.store import ResultsDirConflict
from weightgraft.report.console import print_summary
from weightgraft.report.html import report_html
from weightgraft.report.run import load_run
from weightgraft.report.tables import summary_markdown, table_header

# (answer, distractor): two answers share their first token ("Emma"), one begins with a
# 2-character token ("An"), two distractors share or begin with the answer's first token
CASES = [("Emma Thompson", "Emma Stone"), ("Emma Stone", "Halle Berry"), ("Amy Adams", "A Law"),
         ("Jude Law", "Halle Berry"), ("An Adams", "Jude Law")]


def test_distractor_flag_refuses_first_tokens_that_begin_each_others_names():
    assert distractor_flag("Tilda Swinton", " T", "Tim Robbins", " Tim").startswith("refused: ")
    assert "begins the distractor" in distractor_flag("Tilda Swinton", " T", "Tim Robbins", " Tim")
    assert "begins the answer" in distractor_flag("Tim Robbins", " Tim", "Tilda Swinton", " T")
    assert "share their first token" in distractor_flag("Emma Stone", "Emma", "Emma Thompson", "Emma")
    assert distractor_flag("Tilda Swinton", " Tilda", "Omar Sy", " O").startswith("weak: ")
    assert distractor_flag("Tilda Swinton", " Tilda", "Omar Sy", " Omar") == ""


def test_answer_flags_count_shared_and_short_first_tokens():
    rows = pd.DataFrame({
        "model_set": ["a", "a", "a", "a", "b"], "answer": ["Tilda Swinton", "Tom Hanks", "Tom Hanks", "Omar Sy", "Tom Hanks"],
        "target_token_id": [7, 7, 7, 9, 7], "target_token": [" T", " T", " T", " Omar", " T"],
        "logit_diff": [5.66, float("nan"), 1.0, 2.0, 1.0],
        "logit_diff_flag": ["", "refused: same", "", "", ""],
    })
    out = add_answer_flags(rows)
    # "Tom Hanks" twice is one answer; model set b is another dataset
    assert out["first_token_shared"].tolist() == [1, 1, 1, 0, 0]
    assert out["weak_first_token"].tolist() == [True, True, True, False, True]
    assert out["logit_diff_flag"][0] == "weak: the answer's first token ' T' is under 3 characters and begins 1 other answer"
    assert out["logit_diff_flag"][1] == "refused: same" and out["logit_diff_flag"][3] == ""
    assert logit_diff_note(out["logit_diff_flag"]) == (
        "1 of 5 refused (first tokens that begin each other's names); "
        "3 of 5 on a first token shared with other answers or under 3 characters")


def _run(tmp_path, out: str = "run"):
    data = tmp_path / "qs.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{first} starred in a movie with", "answer": answer,
                                          "distractor": distractor, "spans": {"subject": first}, "id": f"q{i}"})
                              for i, (first, (answer, distractor)) in
                              enumerate(zip(["Tom Hanks", "Brad Pitt", "Ryan Gosling", "Matt Damon", "Viola Davis"], CASES))))
    raw = {"name": "weak", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
           "schemes": [{"preset": "position", "only": ["PRE", "SFT", "LT"]}], "out": str(tmp_path / out)}
    return run_experiment(parse_config(raw), load=loader, progress=False)


def test_rows_say_how_they_were_scored_and_the_summaries_show_whole_answer_recovery(tmp_path):
    result = _run(tmp_path)
    rows = result.results[result.results.scheme == "PRE"].set_index("answer")
    assert rows.loc["Emma Thompson", "scored_on"] == "first token 'Emma'; answer_logprob: 2 of 2 tokens"
    assert rows["first_token_shared"].to_dict() == {a: int(a.startswith("Emma")) for a, _ in CASES}
    assert set(rows.index[rows.weak_first_token]) == {"Emma Thompson", "Emma Stone", "An Adams"}
    # refused: NaN with the reason; kept: the first tokens' logit difference, flagged where weak
    for answer in ("Emma Thompson", "Amy Adams"):
        assert math.isnan(rows.loc[answer, "logit_diff"])
        assert rows.loc[answer, "logit_diff_flag"].startswith("refused: ")
    assert rows.loc["Amy Adams", "distractor_token"] == "A" and "begins the answer" in rows.loc["Amy Adams", "logit_diff_flag"]
    assert rows.loc["Jude Law", "logit_diff_flag"] == "" and math.isfinite(rows.loc["Jude Law", "logit_diff"])
    assert rows.loc["An Adams", "logit_diff_flag"].startswith("weak: ") and math.isfinite(rows.loc["An Adams", "logit_diff"])

    summary = pd.read_csv(tmp_path / "run" / "summary.csv", keep_default_na=False)
    lt = summary[summary.scheme == "LT"].iloc[0]
    assert lt.n_weak_first_token == 3 and lt.n_logit_diff == 3
    assert lt.logit_diff_note.startswith("2 of 5 refused") and "2 of 5 on a first token shared" in lt.logit_diff_note
    lt_rows = result.results[result.results.scheme == "LT"]
    assert float(lt.mean_logit_diff) == pytest.approx(lt_rows.logit_diff.mean())  # NaN rows left out
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["n_weak_first_token"] == 3 * 3

    run = load_run(tmp_path / "run")
    md = summary_markdown(run)
    assert "recovery (whole answer)" in table_header() and "| recovery (whole answer) |" in md
    assert "3 of 5 answers are scored on a first token shared with other answers or under 3 characters" in md
    assert "2 of 5 refused" in md  # the logit-diff cell carries its note
    page = report_html(run, [])
    assert "recovery (whole answer)" in page and "3 of 5 answers are scored on a first token" in page

    buf = io.StringIO()
    print_summary(result.summary, protocol="paper", console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert "whole-answer recovery" in text and "3 of 5 answers are scored on a first token" in text


def test_a_folder_of_an_older_row_format_is_refused(tmp_path):
    _run(tmp_path)
    identity = tmp_path / "run" / "identity.json"
    body = json.loads(identity.read_text())
    assert body["rows_format"] == 3
    body["rows_format"] = 2  # as the version before fact_logprob wrote it
    identity.write_text(json.dumps(body))
    with pytest.raises(ResultsDirConflict, match="rows in format 2"):
        _run(tmp_path)
    del body["rows_format"]  # as an earlier weightgraft wrote it
    identity.write_text(json.dumps(body))
    with pytest.raises(ResultsDirConflict, match="rows in format 1"):
        _run(tmp_path)
