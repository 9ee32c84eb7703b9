"""Free-form prompt files through ``run``, and the behaviour metrics: logit difference, KL to
the donor, recovery, paired differences, grafted continuations."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_world import FIRST, SECOND, loader, write_world

from weightgraft.data.freeform import load_prompts, read_freeform
from weightgraft.data.prompts import DatasetError
from weightgraft.experiments.config import ConfigError, parse_config
from weightgraft.experiments.metrics import add_recovery, ratio_of_means
from weightgraft.experiments.pairs import SchemePair, paired_differences
from weightgraft.experiments.runner import run_experiment


def _write(path, records) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def _records(n: int = 6) -> list[dict]:
    return [
        {"prompt": f"{FIRST[i]} starred in a movie with", "answer": SECOND[i], "distractor": SECOND[i + 1],
         "spans": {"subject": FIRST[i]}, "id": f"q{i}"}
        for i in range(n)
    ]


def test_freeform_spans_ids_and_errors(tmp_path):
    recs = [
        {"prompt": "The Eiffel Tower is in", "answer": "Paris", "spans": {"subject": "Eiffel Tower", "tail": [17, 22]}},
        {"prompt": "Rome is in", "answer": "Italy", "group": "capitals", "distractor": "France"},
    ]
    prompts = read_freeform(_write(tmp_path / "q.jsonl", recs))
    assert prompts[0].spans == {"subject": (4, 16), "tail": (17, 22)} and prompts[0].id == "line1"
    assert prompts[0].template == "freeform" and prompts[0].distractor is None
    assert prompts[1].group == "capitals" and prompts[1].distractor == "France"
    assert load_prompts(tmp_path / "q.jsonl") == prompts
    bad = [recs[0], {"prompt": "Rome is in", "answer": "Italy", "spans": {"subject": "Paris"}}]
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: span 'subject': 'Paris' does not occur"):
        read_freeform(_write(tmp_path / "bad.jsonl", bad))
    for rec, msg in (({"prompt": "x"}, "missing 'answer'"), ({**recs[1], "spam": 1}, "unknown field"),
                     ({**recs[1], "spans": {"s": [3, 99]}}, "span 's'")):
        with pytest.raises(DatasetError, match=f"one.jsonl:1: .*{msg}"):
            read_freeform(_write(tmp_path / "one.jsonl", [rec]))
    with pytest.raises(DatasetError, match="already used on line 1"):
        read_freeform(_write(tmp_path / "dup.jsonl", [{**recs[1], "id": 7}] * 2))


def _run(tmp_path, out: str, **extra):
    raw = {
        "name": "ff", "data": _write(tmp_path / "qs.jsonl", _records()),
        "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
        "schemes": [{"preset": "position", "only": ["PRE", "SFT", "FE", "LT", "FE+LT"]}],
        "out": str(tmp_path / out), **extra,
    }
    return run_experiment(parse_config(raw), load=loader, progress=False)


@torch.no_grad()
def test_behaviour_metrics_against_the_models(tmp_path):
    res = _run(tmp_path, "run", pairs=[["FE+LT", "LT"], {"a": "FE", "b": "PRE"}],
               generate={"n_examples": 2, "max_new_tokens": 3}).results
    assert len(res) == 6 * 5
    pre, sft = loader("tiny-llama:pre"), loader("tiny-llama:sft")
    tok = pre.tokenizer

    def last_logits(model, prompt):
        return model(torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1].double()

    for _, row in res[res.scheme.isin(["PRE", "SFT"])].iterrows():
        own = last_logits((pre if row.scheme == "PRE" else sft).model, row.prompt)
        donor = last_logits(sft.model, row.prompt)
        a = tok(" " + row.answer, add_special_tokens=False)["input_ids"][0]
        d = tok(" " + row.distractor, add_special_tokens=False)["input_ids"][0]
        assert row.logit_diff == pytest.approx(float(own[a] - own[d]), abs=1e-4)
        p, q = torch.log_softmax(donor, -1), torch.log_softmax(own, -1)
        assert row.kl_donor == pytest.approx(float((p.exp() * (p - q)).sum()), abs=1e-4)
        assert row.donor_role == "sft" and row.base_scheme == "PRE" and row.donor_scheme == "SFT"
    assert (res[res.scheme == "SFT"].kl_donor == 0).all() and (res[res.scheme == "PRE"].kl_donor > 0).all()
    # recovery: PRE 0, SFT 1, others from the stored first-token (recovery) and whole-answer
    # (recovery_answer) log-probs of the same example
    for name, source in (("recovery", "first_logprob"), ("recovery_answer", "answer_logprob")):
        ok = res[~res[f"{name}_small_gap"]]
        assert len(ok) and np.allclose(ok[ok.scheme == "PRE"][name], 0) and np.allclose(ok[ok.scheme == "SFT"][name], 1)
        lp = res.pivot(index="example_id", columns="scheme", values=source)
        expected = (lp["LT"] - lp["PRE"]) / (lp["SFT"] - lp["PRE"])
        got = res[res.scheme == "LT"].set_index("example_id")[name]
        np.testing.assert_allclose(got.loc[expected.index], expected, rtol=1e-12)
    # the first-token log-prob is the one top-k is scored on
    for _, row in res[res.scheme == "PRE"].iterrows():
        logits = last_logits(pre.model, row.prompt)
        assert row.first_logprob == pytest.approx(float(torch.log_softmax(logits, -1)[row.target_token_id]), abs=1e-5)
        assert np.exp(row.first_logprob) == pytest.approx(row.prob, rel=1e-4)

    summary = pd.read_csv(tmp_path / "run" / "summary.csv")
    for col in ("mean_logit_diff", "logit_diff_lo", "logit_diff_hi", "mean_kl_donor", "recovery",
                "recovery_lo", "recovery_hi", "n_recovery", "recovery_note", "recovery_answer"):
        assert col in summary.columns
    lt = summary[summary.scheme == "LT"].iloc[0]
    assert lt.logit_diff_lo <= lt.mean_logit_diff <= lt.logit_diff_hi
    assert lt.mean_logit_diff == pytest.approx(res[res.scheme == "LT"].logit_diff.mean())
    # the summary's recovery is a ratio of means over the examples, not a mean of ratios
    flp = res.pivot(index="example_id", columns="scheme", values="first_logprob")
    assert lt.recovery == pytest.approx((flp["LT"] - flp["PRE"]).mean() / (flp["SFT"] - flp["PRE"]).mean())
    assert lt.n_recovery == len(flp)
    if np.isnan(lt.recovery_lo):  # declined (few or skewed examples): the note says why
        assert "no interval" in lt.recovery_note
    else:
        assert lt.recovery_lo <= lt.recovery <= lt.recovery_hi
    assert "few examples" in lt.recovery_note  # 6 examples: said next to the number
    lp = res.pivot(index="example_id", columns="scheme", values="answer_logprob")

    pairs = pd.read_csv(tmp_path / "run" / "summary_pairs.csv")
    row = pairs[(pairs.a == "FE+LT") & (pairs.metric == "answer_logprob")].iloc[0]
    assert row.n == 6 and row.mean_diff == pytest.approx((lp["FE+LT"] - lp["LT"]).mean())
    assert row.lo <= row.mean_diff <= row.hi
    assert set(pairs.metric) >= {"top1", "logit_diff", "kl_donor", "recovery"}

    cont = pd.read_csv(tmp_path / "run" / "continuations.csv")
    assert len(cont) == 2 * 5 and cont.error.isna().all() and cont.continuation.notna().all()


@pytest.mark.slow
def test_kl_is_the_same_whether_the_donor_row_shares_the_batch(tmp_path):
    """batch_size 1 adds the donor baseline as an extra row; a large batch reuses its row."""
    one = _run(tmp_path, "one", batch_size=1).results
    big = _run(tmp_path, "big", batch_size=64).results
    np.testing.assert_allclose(one.kl_donor, big.kl_donor, rtol=1e-5, atol=1e-6)


def test_without_a_donor_baseline_kl_and_recovery_are_nan(tmp_path):
    raw = {
        "name": "nb", "data": str(write_world(tmp_path / "data")),
        "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
        "schemes": [{"preset": "position", "only": ["PRE", "LT"]}], "out": str(tmp_path / "nb"),
    }
    res = run_experiment(parse_config(raw), load=loader, progress=False).results
    assert res.kl_donor.isna().all() and res.recovery.isna().all() and res.logit_diff.isna().all()


def test_pairs_and_generation_are_checked_before_loading(tmp_path):
    base = {"data": "x.jsonl", "models": {"pre": "a", "sft": "b"}, "schemes": [{"preset": "position"}]}
    with pytest.raises(ConfigError, match="'LTX' is not in the sweep"):
        parse_config({**base, "pairs": [["LT", "LTX"]]})
    with pytest.raises(ConfigError, match="two schemes"):
        parse_config({**base, "pairs": [["LT"]]})
    with pytest.raises(ConfigError, match="generate.schemes"):
        parse_config({**base, "generate": {"schemes": ["nope"]}})


def test_summary_recovery_is_a_ratio_of_means_that_one_small_gap_cannot_swing():
    """One example with a 0.52-nat gap and a large loss (the issue's case): a mean of ratios
    is pulled far below zero, the ratio of means stays near the other examples' share."""
    gain = np.array([3.0, 2.5, 3.5, -9.8])  # the last example: graft - PRE
    gap = np.array([4.0, 3.0, 4.0, 0.52])
    value, lo, hi, n, note = ratio_of_means(gain, gap)
    assert value == pytest.approx(gain.mean() / gap.mean()) and n == 4
    assert np.mean(gain / gap) < -3 < value  # the per-example mean is what misled
    # one example far from the others at n = 4: no interval keeps its coverage, and the note says so
    assert np.isnan(lo) and np.isnan(hi) and "few examples (n=4)" in note
    assert "no interval: the whole effect's interval at 99.99999% includes 0" in note
    rng = np.random.default_rng(0)
    gaps = rng.normal(4.0, 0.5, 30)
    spread = ratio_of_means(0.7 * gaps + rng.normal(0, 0.2, 30), gaps)
    assert spread[1] < spread[0] < spread[2] and spread[4] == ""
    many = ratio_of_means(np.full(40, 2.0), np.full(40, 4.0))
    assert many[0] == pytest.approx(0.5) and many[4] == ""  # stable: no note
    small = ratio_of_means(np.full(40, 0.1), np.full(40, 0.2))
    assert "small SFT-PRE gap" in small[4]


def test_recovery_flags_a_tiny_gap():
    frame = pd.DataFrame({
        "model_set": "d", "template": "t", "example_id": ["a"] * 3 + ["b"] * 3,
        "scheme": ["PRE", "SFT", "G"] * 2, "first_logprob": [-5.0, -1.0, -2.0, -3.0, -2.99, -2.995],
        "answer_logprob": [-6.0, -2.0, -3.0, -4.0, -3.99, -3.995], "base_scheme": "PRE", "donor_scheme": "SFT",
    })
    out = add_recovery(frame)
    assert out.recovery.tolist()[:3] == pytest.approx([0.0, 1.0, 0.75], abs=1e-12)
    assert out.recovery_small_gap.tolist() == [False] * 3 + [True] * 3
    pairs = paired_differences(out.assign(finite=True), [SchemePair(a="G", b="PRE")], metrics=["recovery", "answer_logprob"])
    assert pairs.set_index("metric").loc["recovery", "n"] == 1  # the small-gap example is left out
    assert pairs.set_index("metric").loc["answer_logprob", "mean_diff"] == pytest.approx((3.0 + 0.005) / 2)


def test_report_shows_behaviour_columns_and_continuations(tmp_path):
    from weightgraft.report import write_report

    _run(tmp_path, "rep", generate={"n_examples": 1, "max_new_tokens": 2, "schemes": ["PRE", "LT"]})
    paths = write_report(tmp_path / "rep")
    md = paths.summary_md.read_text()
    assert "logit diff vs distractor" in md and "KL(donor‖graft)" in md and "## Grafted continuations" in md
    cont = pd.read_csv(tmp_path / "rep" / "continuations.csv")
    assert cont.scheme.tolist() == ["PRE", "LT"]
    assert "Grafted continuations" in paths.html.read_text()


def test_the_donor_of_each_scheme():
    from weightgraft.experiments.scoring import baselines
    from weightgraft.schemes.presets import preset
    from weightgraft.schemes.scheme import Rule, Scheme

    fwd = preset("position", direction="pre2sft")
    back = [s.model_copy(update={"name": f"{s.name}/back"}) for s in preset("position", direction="sft2pre")
            if s.rules]
    mixed = Scheme(name="mixed", rules=[Rule(model="sft"), Rule(model="task", positions="last")])
    b = baselines([*fwd, *back, mixed], "pre")
    assert b.donor_role["PRE"] is None  # two roles besides pre in the sweep (sft, task): no single donor
    assert b.donor_role["LT"] == "sft" and b.donor_role["LT/back"] == "sft" and b.donor_role["mixed"] is None
    assert b.donor_scheme["LT/back"] == "SFT" and b.base_scheme["LT/back"] == "PRE"
    b = baselines(fwd, "pre")
    assert b.donor_role["PRE"] == "sft" and b.donor_scheme["PRE"] == "SFT"
