"""Metrics on hand-computed logits."""

from __future__ import annotations

import math

import pandas as pd
import torch
from pytest import approx

from weightgraft.experiments.metrics import summarize
from weightgraft.experiments.prediction import answer_logprob, score_next_token


def test_rank_counts_strictly_more_probable_tokens():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0])
    p = score_next_token(logits, target=2)
    assert p.rank == 2  # tokens 1 and 3
    assert math.isclose(p.prob, math.exp(2) / sum(math.exp(x) for x in [1, 3, 2, 3, 0]), rel_tol=1e-6)
    assert p.hits[1] is False and p.hits[5] is True
    tie = score_next_token(logits, target=1)
    assert tie.rank == 0 and tie.hits[1]  # a tie for first counts as rank 0
    assert p.top_ids[:2] in ([1, 3], [3, 1]) and p.top_ids[2] == 2


def test_non_finite_logits_are_flagged():
    p = score_next_token(torch.tensor([0.0, float("nan"), 1.0]), target=0)
    assert not p.finite and p.rank == -1 and not any(p.hits.values())


def test_answer_logprob_sums_teacher_forced_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    assert math.isclose(answer_logprob(logits, [0, 2]), math.log(0.5) + math.log(0.8), rel_tol=1e-6)


def test_summary_rates_carry_clopper_pearson_intervals_never_a_point():
    """6 of 6 hits is 100 [54, 100], not [100, 100] (the interval a resampling of six hits gives)."""
    rows = [{"model_set": "m", "template": "t", "scheme": "SFT", "family": "position", "rank": 0, "prob": 0.9,
             "answer_logprob": -0.1, "finite": True, **{f"top{k}": True for k in (1, 5, 10, 20, 50, 100)}}
            for _ in range(6)]
    (row,) = summarize(pd.DataFrame(rows)).to_dict("records")
    assert row["top5"] == approx(1.0) and row["top5_hi"] == approx(1.0) and 0.5 < row["top5_lo"] < 0.6


def test_summary_excludes_non_finite_rows_from_averages():
    rows = []
    for rank, finite in [(0, True), (3, True), (7, True), (-1, False)]:
        row = {"model_set": "m", "template": "headline", "scheme": "LT", "family": "position",
               "rank": rank, "prob": 0.1, "answer_logprob": -2.0, "finite": finite}
        row.update({f"top{k}": finite and rank < k for k in (1, 5, 10, 20, 50, 100)})
        rows.append(row)
    summary = summarize(pd.DataFrame(rows))
    (row,) = summary.to_dict("records")
    assert row["n"] == 3 and row["n_nonfinite"] == 1
    assert math.isclose(row["top1"], 1 / 3) and math.isclose(row["top5"], 2 / 3)
    assert math.isclose(row["mean_rank"], 10 / 3)
