"""``wg.compare`` returns the rows the runner writes for the same prompts and schemes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from tiny_world import loader, write_world

import weightgraft as wg
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment

SAME = ["model_set", "template", "scheme", "family", "labels", "prompt", "answer", "target_token_id",
        "target_token", "rank", "n_answer_tokens", "top1", "top5", "top10", "top20", "top50", "top100",
        "finite"]


@pytest.mark.slow
def test_compare_rows_equal_the_runners_rows(tmp_path):
    data = write_world(tmp_path / "data")
    config = parse_config({
        "name": "tiny", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
        "schemes": [{"preset": "position"}], "out": str(tmp_path / "run"), "batch_size": 7,
    })
    run = run_experiment(config, load=loader, progress=False).results
    records = [json.loads(line) for line in (data / "test_prompts.jsonl").read_text().splitlines()]
    pre, sft = loader("tiny-llama:pre"), loader("tiny-llama:sft")
    for template in ("headline", "qa"):
        chosen = [r for r in records if r["template"] == template]
        df = wg.compare(
            {"pre": pre.model, "sft": sft.model}, pre.tokenizer, [r["prompt"] for r in chosen],
            [r["answer"] for r in chosen], wg.presets.position(), batch_size=7,
            spans=[r["spans"] for r in chosen], template=template, model_set="default",
        )
        theirs = run[run.template == template].reset_index(drop=True)
        assert len(df) == len(theirs) == len(chosen) * 8
        assert set(theirs.columns) <= set(df.columns)  # every column the runner writes
        pd.testing.assert_frame_equal(df[SAME], theirs[SAME], check_dtype=False)
        # float32: the runner batches both templates together, wg.compare one at a time, so rows
        # meet other padding and prefix groups; that moves probabilities by ~1e-6 relative.
        np.testing.assert_allclose(df["prob"], theirs["prob"], rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(df["answer_logprob"], theirs["answer_logprob"], rtol=1e-6, atol=1e-6)
        assert [list(t) for t in df["top_tokens"]] == [list(t) for t in theirs["top_tokens"]]
        assert df["example_id"].tolist() == [str(i) for i in range(len(chosen)) for _ in range(8)]


def test_compare_refuses_bad_input_before_compute(tiny_pair, tiny_tok, monkeypatch):
    pre, sft = tiny_pair("llama")
    monkeypatch.setattr("weightgraft.api.compare.compute_logits", lambda *a, **k: pytest.fail("computed"))
    models, prompts = {"pre": pre, "sft": sft}, ["Paris is in", "Rome is in"]
    cases = [
        (dict(answers=["France"]), "answers has 1 entries for 2 prompts"),
        (dict(schemes=wg.presets.position()), "prompt 0 ('Paris is in'): span not found"),
        (dict(schemes=[wg.Scheme(name="X", base="pre", rules=[wg.Rule(model="dpo")])]), "uses model role 'dpo'"),
        (dict(schemes=[wg.Scheme(name="X"), wg.Scheme(name="X")]), "two schemes are named 'X'"),
        (dict(answers=["France", " "]), "answer 1 must be a non-empty string"),
    ]
    for kwargs, message in cases:
        args = dict(models=models, tokenizer=tiny_tok, prompts=prompts, answers=["France", "Italy"],
                    schemes=wg.presets.baselines())
        args.update(kwargs)
        with pytest.raises(ValueError, match=None) as err:
            wg.compare(**args)
        assert message in str(err.value), str(err.value)


def test_compare_with_spans_runs_the_position_family(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("gemma")
    prompts = ["Paris is in", "Rome is in"]
    df = wg.compare({"pre": pre, "sft": sft}, tiny_tok, prompts, ["France", "Italy"],
                    wg.presets.position(), spans=[{"city": "Paris"}, {"city": (0, 4)}])
    assert len(df) == 2 * 8 and set(df["family"]) == {"baseline", "position"}
    # the LT scheme's first-token rank equals wg.graft's logits at the last token
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts, wg.Rule(model="sft", positions="last"))
    target = [tiny_tok(" " + a, add_special_tokens=False)["input_ids"][0] for a in ["France", "Italy"]]
    lt = df[df.scheme == "LT"]
    for b, row in enumerate(lt.itertuples()):
        logits = out.logits[b]
        assert row.rank == int((logits > logits[target[b]]).sum())
