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
    OTHER_MODEL,
    PAPER_TEXT_SHA256,
    SAME_EQUIVALENT,
    SAME_NOT_EQUIVALENT,
    SHOWN,
    STATED,
    Measured,
    equivalent,
    normalize_text,
    paper_numbers,
    paper_text_sha256,
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

ROOT = Path(__file__).resolve().parents[2]
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


def test_side_by_side_has_one_row_per_key_the_stated_first_and_says_what_was_not_run():
    measured = {
        ("fig2", "LT", "top-5 accuracy"): Measured(45.0, 30.0, 60.0, n=40),
        ("fig2", "FE", "top-5 accuracy"): Measured(12.5),  # no interval
        ("fig4", "ffn@fourth_quarter vs o_ffn@fourth_quarter", "drop in top-5 accuracy"):
            Measured(7.5, -2.5, 17.5, unit="points", n=40, relative=Measured(15.0, -5.0, 30.0, unit="% relative")),
        ("fig2", "LT", "top-1 accuracy"): Measured(1.0),  # the paper has no such row
    }
    rows = side_by_side(measured, figure_ids={"fig2", "fig4"}, not_run={"fig2": "sweep position not selected"})
    assert {r.figure_id for r in rows} == {"fig2", "fig4"}
    assert len(rows) == 8 + 8 + 1  # one row per scheme of each figure, the two models' drops in one
    assert [r.stated for r in rows] == sorted((r.stated for r in rows), reverse=True)  # the stated first
    by_key = {(r.figure_id, r.scheme): r for r in rows}
    lt = by_key[("fig2", "LT")]
    assert lt.paper == "53% (gemma-1.1-2b-it); shown, not stated (gpt2-xl, Llama-3.2-1B, pythia-2.8b)"
    assert (lt.ours, lt.prompts, lt.verdict) == ("45.0% [30.0, 60.0]", "40", OTHER_MODEL)
    assert lt.ids[0] == "fig2:gemma:LT" and "headline" in lt.assumes
    assert by_key[("fig2", "PRE")].ours == NOT_RUN and by_key[("fig2", "PRE")].verdict == \
        "not run: sweep position not selected"
    assert by_key[("fig2", "FE")].paper.startswith("28% (gpt2-xl)") and by_key[("fig2", "FE")].ours == "12.5%"
    drop = by_key[("fig4", "ffn@fourth_quarter vs o_ffn@fourth_quarter")]
    assert drop.paper == "29% (gemma-1.1-2b-it); 41% (Llama-3.2-1B)"
    assert drop.ours == "7.5 points [-2.5, 17.5]; 15.0% relative [-5.0, 30.0]"
    assert "points, and % relative" in drop.cells()[3] and "does not say whether" in drop.assumes
    assert by_key[("fig4", "o_ffn@fourth_quarter")].verdict == f"{NOT_RUN}: no such row in the run's results"
    assert unmatched(measured) == [("fig2", "LT", "top-1 accuracy")]
    everything = side_by_side({})
    assert len(everything) == len({n.key for n in paper_numbers()}) and {r.ours for r in everything} == {NOT_RUN}
    assert Measured(float("nan")).text() == "n/a"
    assert Measured(0.25, 0.1, float("nan"), unit="", digits=3).text() == "0.250"


def test_markdown_has_the_header_with_units_and_one_line_per_key():
    rows = side_by_side({("fig5", "FE:ATTN", "top-5 accuracy"): Measured(20.0, 8.0, 35.0, n=20)}, figure_ids={"fig5"})
    text = to_markdown(rows)
    lines = text.splitlines()
    assert lines[0] == ("| figure or section | sentence | scheme | metric (unit) | the paper (its models) | ours [95% "
                        "interval], in the metric's unit | prompts | verdict | the row assumes |")
    assert len(lines) == 2 + len(rows) == 2 + 5
    assert lines[2].startswith("| Fig. 5 | headline | FE:ATTN | top-5 accuracy (% of prompts) | 63% (gemma-1.1-2b-it); "
                               "34% (Llama-3.2-1B) | 20.0% [8.0, 35.0] | 20 | other model: shape only | task ATTN")
    assert "| Fig. 5 | headline | FE:FFN | top-5 accuracy (% of prompts) | shown, not stated (gemma-1.1-2b-it, " \
           "Llama-3.2-1B) | not run |  | not run: no such row in the run's results |" in text
    assert text.endswith("\n")
    piped = dataclasses.replace(rows[0], scheme="a|b")
    assert "a\\|b" in to_markdown([piped])


@pytest.mark.parametrize("hits, n, verdict", [(212, 400, SAME_EQUIVALENT), (4, 8, SAME_NOT_EQUIVALENT)])
def test_on_the_papers_model_a_level_is_equivalent_iff_its_90_interval_lies_within_the_margin(hits, n, verdict):
    """53% on gemma-1.1-2b-it, margin 10 points: 212 of 400 (90% CP [48.8, 57.2]) is equivalent,
    4 of 8 (90% CP [19.3, 80.7]) is not; a gpt2-xl number beside it stays shape only."""
    from weightgraft.stats import rate_ci

    _, low, high = rate_ci(hits, n, level=0.90)
    ours = Measured(100 * hits / n, n=n, low90=100 * low, high90=100 * high)
    assert equivalent(53, 100 * low, 100 * high, 10.0) is (verdict == SAME_EQUIVALENT)
    rows = {r.scheme: r for r in side_by_side({("fig2", "LT", "top-5 accuracy"): ours,
                                               ("fig2", "FE", "top-5 accuracy"): ours},
                                              figure_ids={"fig2"}, model="gemma-1.1-2b-it", margin=10.0)}
    assert rows["LT"].verdict == verdict
    assert rows["FE"].verdict == OTHER_MODEL  # 28% is gpt2-xl's
    assert side_by_side({("fig2", "LT", "top-5 accuracy"): ours}, figure_ids={"fig2"}, model="gpt2-xl")[0].verdict \
        == OTHER_MODEL


def test_the_margin_is_the_rule_at_its_edges():
    assert equivalent(53, 43.0, 63.0, 10.0) and not equivalent(53, 42.9, 60.0, 10.0)
    assert not equivalent(53, 45.0, 63.1, 10.0) and equivalent(53, 45.0, 63.1, 10.5)


def test_a_drop_on_the_papers_model_is_tested_in_points_and_relative():
    """Fig. 4's 29%: a drop of 29 points from 60% to 31% (1,000 prompts) is equivalent in points
    and not relative (48%); on Llama the same drop is beside 41% and on another model shape only."""
    from weightgraft.paper.measured import drop_measured

    table = [300, 300, 10, 390]  # both, with O only, without O only, neither
    ours = drop_measured({"drop": 29.0, "low": 26.0, "high": 32.0, "n": 1000, "table": table})
    assert ours.relative is not None and ours.relative.value == pytest.approx(100 * (1 - 310 / 600))
    key = ("fig4", "ffn@fourth_quarter vs o_ffn@fourth_quarter", "drop in top-5 accuracy")
    (gemma,) = [r for r in side_by_side({key: ours}, figure_ids={"fig4"}, model="gemma-1.1-2b-it") if r.stated]
    assert gemma.verdict == ("gemma-1.1-2b-it: same model: equivalent in points, not equivalent relative; "
                             "Llama-3.2-1B: other model: shape only")
    (llama,) = [r for r in side_by_side({key: ours}, figure_ids={"fig4"}, model="Llama-3.2-1B") if r.stated]
    assert llama.verdict.endswith("Llama-3.2-1B: same model: not equivalent in points, not equivalent relative")
    (other,) = [r for r in side_by_side({key: ours}, figure_ids={"fig4"}) if r.stated]
    assert other.verdict == OTHER_MODEL and "equivalent" not in other.verdict


def test_the_relative_drop_interval_covers_at_its_level():
    """The delta-method interval of 1 - rate_without / rate_with on the same prompts: 95% coverage
    within 0.93-0.97 on 40 prompts (2,000 simulated tables)."""
    import numpy as np

    from weightgraft.paper.measured import relative_drop_ci

    rng = np.random.default_rng(0)
    probs = [0.5, 0.3, 0.05, 0.15]  # both, with only, without only, neither
    truth = 1 - (probs[0] + probs[2]) / (probs[0] + probs[1])
    covered = [lo <= truth <= hi for lo, hi in (relative_drop_ci(*rng.multinomial(40, probs))[1:] for _ in range(2000))]
    assert 0.93 <= float(np.mean(covered)) <= 0.97
    assert np.isnan(relative_drop_ci(0, 0, 3, 5)[0])  # nothing hit with the component: no ratio
