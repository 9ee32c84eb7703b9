"""The table of the paper's numbers (``weightgraft/paper/numbers.csv``): every stated number is
in its quote, every quote is in the paper's text (``tests/data/paper-full-text.txt``, a copy of
``../shared/paper/paper-full-text.txt`` held to the package's sha256), every scheme is one of
ours; and the side-by-side rows and their markdown."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest

from weightgraft.paper.numbers import (
    COLUMNS,
    NOT_RUN,
    PAPER_TEXT_SHA256,
    SHOWN,
    STATED,
    Measured,
    paper_numbers,
    paper_text_sha256,
    normalize_text,
    read_numbers,
    side_by_side,
    to_markdown,
    unmatched,
)
from weightgraft.schemes.authors_presets import (
    authors_component_schemes,
    authors_hybrid_schemes,
    authors_position_schemes,
)

ROOT = Path(__file__).resolve().parents[1]
PAPER_COPY = ROOT / "tests" / "data" / "paper-full-text.txt"
PAPER_SHARED = ROOT.parent / "shared" / "paper" / "paper-full-text.txt"
NUMBER = re.compile(r"\d+(?:\.\d+)?")


@pytest.fixture(scope="module")
def paper_text() -> str:
    return normalize_text(PAPER_COPY.read_text(encoding="utf-8"))


def test_the_repo_copy_of_the_paper_is_the_text_the_quotes_came_from():
    assert paper_text_sha256(PAPER_COPY.read_text(encoding="utf-8")) == PAPER_TEXT_SHA256


def test_the_shared_paper_text_has_not_changed():
    if not PAPER_SHARED.exists():
        pytest.skip(f"{PAPER_SHARED} is not on this machine")
    assert paper_text_sha256(PAPER_SHARED.read_text(encoding="utf-8")) == PAPER_TEXT_SHA256


def test_every_stated_number_is_a_number_in_its_quote():
    stated = [n for n in paper_numbers() if n.status == STATED]
    assert len(stated) >= 7
    missing = [(n.id, n.value, n.quote) for n in stated if n.value not in NUMBER.findall(n.quote)]
    assert missing == []


def test_every_quote_is_verbatim_in_the_paper(paper_text):
    missing = [(n.id, n.quote) for n in paper_numbers() if normalize_text(n.quote) not in paper_text]
    assert missing == []


def test_every_line_reference_points_at_its_quote():
    lines = [normalize_text(line) for line in PAPER_COPY.read_text(encoding="utf-8").splitlines()]
    wrong = []
    for n in paper_numbers():
        m = re.search(r"line (\d+)$", n.where)
        if m is None or normalize_text(n.quote) not in lines[int(m.group(1)) - 1]:
            wrong.append((n.id, n.where))
    assert wrong == []


def test_the_numbers_the_issue_names_are_there_with_their_settings():
    by_id = {n.id: n for n in paper_numbers()}
    expected = {
        "fig2:gemma:LT": ("53", "gemma-1.1-2b-it", "LT"),
        "fig2:gemma:SFT": ("100", "gemma-1.1-2b-it", "SFT"),
        "fig2:gpt2xl:FE": ("28", "gpt2-xl", "FE"),
        "fig4:gemma:drop-o": ("29", "gemma-1.1-2b-it", "ffn@fourth_quarter vs o_ffn@fourth_quarter"),
        "fig4:llama:drop-o": ("41", "Llama-3.2-1B", "ffn@fourth_quarter vs o_ffn@fourth_quarter"),
        "fig5:gemma:FE:ATTN": ("63", "gemma-1.1-2b-it", "FE:ATTN"),
        "fig5:llama:FE:ATTN": ("34", "Llama-3.2-1B", "FE:ATTN"),
    }
    for id_, (value, model, scheme) in expected.items():
        n = by_id[id_]
        assert (n.value, n.model, n.scheme, n.status, n.unit) == (value, model, scheme, STATED, "%")
    # Fig. 4 is the reversal setting; the SFT -> PRE component figure is Fig. 14
    assert "both directions" in by_id["fig4:gemma:o_ffn@fourth_quarter"].quote
    assert "Baselines" in by_id["fig14:gemma:o_ffn@fourth_quarter"].quote


def test_rows_shown_not_stated_have_no_value_and_keys_are_unique():
    rows = paper_numbers()
    assert {n.status for n in rows} == {STATED, SHOWN}
    assert all(n.value == "" and n.number is None for n in rows if n.status == SHOWN)
    assert all(n.number is not None for n in rows if n.status == STATED)
    keys = Counter((n.figure_id, n.model, n.scheme, n.metric) for n in rows)
    assert [k for k, c in keys.items() if c > 1] == []
    assert {n.model for n in rows} == {"gemma-1.1-2b-it", "gpt2-xl", "Llama-3.2-1B", "pythia-2.8b", "all"}


def test_every_scheme_is_one_of_ours():
    ours = {s.name for s in authors_position_schemes() + authors_component_schemes() + authors_hybrid_schemes()}
    unknown = []
    for n in paper_numbers():
        parts = n.scheme.split(" vs ")
        if any(p not in ours for p in parts):
            unknown.append((n.id, n.scheme))
    assert unknown == []


def test_the_reader_refuses_a_stated_row_without_its_number_and_a_shown_row_with_one():
    head = ",".join(COLUMNS)

    def row(id_: str, value: str, status: str) -> str:
        return f'{id_},Fig. 2,fig2,gpt2-xl,d,headline,LT,top-5 accuracy,{value},%,"{status}",q,w,'

    assert [n.number for n in read_numbers(f"{head}\n{row('a', '53', STATED)}\n{row('b', '', SHOWN)}\n")] == [53.0, None]
    with pytest.raises(ValueError, match="needs its number"):
        read_numbers(f"{head}\n{row('a', '', STATED)}\n")
    with pytest.raises(ValueError, match="has no value"):
        read_numbers(f"{head}\n{row('a', '12', SHOWN)}\n")
    with pytest.raises(ValueError, match="id of its own"):
        read_numbers(f"{head}\n{row('a', '1', STATED)}\n{row('a', '2', STATED)}\n")
    with pytest.raises(ValueError, match="columns"):
        read_numbers("id,figure\na,b\n")


def test_side_by_side_sets_ours_beside_the_paper_and_says_what_was_not_run():
    measured = {
        ("fig2", "LT", "top-5 accuracy"): Measured(45.0, 30.0, 60.0),
        ("fig2", "FE", "top-5 accuracy"): Measured(12.5),  # no interval
        ("fig4", "ffn@fourth_quarter vs o_ffn@fourth_quarter", "drop in top-5 accuracy"):
            Measured(7.5, -2.5, 17.5, unit="points"),
        ("fig2", "LT", "top-1 accuracy"): Measured(1.0),  # the paper has no such row
    }
    rows = side_by_side(measured, figure_ids={"fig2", "fig4"})
    by_id = {r.id: r for r in rows}
    assert {r.id.split(":")[0] for r in rows} == {"fig2", "fig4"}
    assert len(rows) == 32 + 2 * 8 + 2  # Fig. 2: 4 models x 8 schemes; Fig. 4: 2 x 8 and the two drops
    lt = by_id["fig2:gemma:LT"]
    assert (lt.figure, lt.model, lt.paper, lt.ours) == ("Sec. 4.1", "gemma-1.1-2b-it", "53%", "45.0% [30.0, 60.0]")
    pythia = by_id["fig2:pythia:LT"]  # shown, not stated: ours still beside it
    assert (pythia.model, pythia.paper, pythia.ours) == ("pythia-2.8b", SHOWN, "45.0% [30.0, 60.0]")
    assert by_id["fig2:gpt2xl:FE"].paper == "28%" and by_id["fig2:gpt2xl:FE"].ours == "12.5%"
    assert by_id["fig2:gemma:FE+LT"].ours == NOT_RUN
    assert by_id["fig4:llama:drop-o"].paper == "41%" and by_id["fig4:llama:drop-o"].ours == "7.5 points [-2.5, 17.5]"
    assert unmatched(measured) == [("fig2", "LT", "top-1 accuracy")]
    # every row, all figures: the ones we did not measure say so
    everything = side_by_side({})
    assert len(everything) == len(paper_numbers()) and {r.ours for r in everything} == {NOT_RUN}
    assert Measured(float("nan")).text() == "n/a"
    assert Measured(0.25, 0.1, float("nan"), unit="", digits=3).text() == "0.250"


def test_markdown_has_the_header_and_one_line_per_row():
    rows = side_by_side({("fig5", "FE:ATTN", "top-5 accuracy"): Measured(20.0, 8.0, 35.0)}, figure_ids={"fig5"})
    text = to_markdown(rows)
    lines = text.splitlines()
    assert lines[0] == "| figure or section | model | scheme | metric | the paper | ours |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert len(lines) == 2 + len(rows) == 2 + 10
    assert "| Fig. 5 | gemma-1.1-2b-it | FE:ATTN | top-5 accuracy | 63% | 20.0% [8.0, 35.0] |" in lines
    assert "| Fig. 5 | Llama-3.2-1B | FE:FFN | top-5 accuracy | shown, not stated | not run |" in lines
    assert text.endswith("\n")
    piped = dataclasses.replace(rows[0], scheme="a|b")
    assert "a\\|b" in to_markdown([piped])
