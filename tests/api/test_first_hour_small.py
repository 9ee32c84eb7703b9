"""Small things a researcher meets in the first hour: one rank convention, numbered example
ids from ``compare``, what ``graft_forward`` and the cache return next to HF's own outputs, the
console table at 80 columns, and an interrupted session kept in the manifest."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from rich.console import Console
from tiny_world import loader, tiny_config

import weightgraft as wg
import weightgraft.experiments.runner as runner
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.report.console import print_summary

PROMPTS = ["Keanu Reeves starred in a movie with", "Paris is in"]
RULE = wg.Rule(model="sft", positions="last", layers="last_half", components="o+ffn")


def test_top_frame_ranks_are_the_results_ranks(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, RULE)
    frame = out.top_frame(4)
    for row in frame.itertuples():
        logits = out.logits[row.prompt_index]
        assert row.rank == int((logits > logits[row.token_id]).sum())  # a run's rank: 0 = likeliest
    assert frame.groupby("prompt_index")["rank"].min().tolist() == [0, 0]


def test_compare_numbers_its_examples(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    df = wg.compare({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, ["Tom", "France"],
                    [s for s in wg.presets.position() if s.name in ("PRE", "LT")])
    assert df.example_id.notna().all()
    assert df.example_id.tolist() == ["0", "0", "1", "1"] and df.prompt.tolist()[::2] == PROMPTS


def test_graft_forward_logits_and_the_last_resid_post_next_to_hf(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    enc = tiny_tok(PROMPTS, padding=True, return_tensors="pt")
    batch, seq = enc["input_ids"].shape
    source = torch.zeros(batch, seq, len(wg.slots(pre)), dtype=torch.long)
    logits = wg.graft_forward([pre, sft], enc["input_ids"], source, attention_mask=enc["attention_mask"])
    assert logits.shape == (batch, seq, pre.config.vocab_size)  # full logits, every position
    out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, PROMPTS, wg.Rule(model="pre"), cache=True)
    with torch.no_grad():
        hf = pre(enc["input_ids"], attention_mask=enc["attention_mask"], output_hidden_states=True)
    mask = enc["attention_mask"].bool()
    last = pre.config.num_hidden_layers - 1
    # HF's last hidden state is after the final norm: the cache's final_norm, not resid_post
    torch.testing.assert_close(out.cache["final_norm"][mask], hf.hidden_states[-1][mask], rtol=0, atol=1e-12)
    assert (out.cache[f"layers.{last}.resid_post"][mask] - hf.hidden_states[-1][mask]).abs().max() > 1e-3
    torch.testing.assert_close(pre.model.norm(out.cache[f"layers.{last}.resid_post"])[mask],
                               hf.hidden_states[-1][mask], rtol=0, atol=1e-12)


def test_unstable_notes_do_not_wrap_rows_at_80_columns():
    note = "unstable: few examples (n=6); small SFT-PRE gap (0.12 nats); the gap's sign changes under resampling"
    rows = [{"model_set": "m", "template": "headline", "direction": "a2b", "scheme": s, "n": 6, "top1": 0.5,
             "top5": 1.0, "mean_rank": 0.5, "recovery": 0.44, "recovery_lo": 0.31, "recovery_hi": 0.58,
             "recovery_note": note} for s in ("FE", "LT", "FE+LT")]
    console = Console(width=80, record=True)
    print_summary(pd.DataFrame(rows), protocol="paper", console=console)
    text = console.export_text()
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) <= 1 + 2 * 3  # the header, then two lines per row (value, CI)
    assert " ".join(text.split()).count(note) == 1 and "⚠1" in text  # the note once, under the table


def test_an_interrupted_session_is_in_the_manifest(tmp_path, monkeypatch):
    raw = tiny_config(tmp_path, "stop", world={"n": 3}, batch_size=2,
                      schemes=[{"preset": "position", "only": ["PRE", "SFT", "LT"]}])
    real, calls = runner.compute_logits, []

    def stop_on_the_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "compute_logits", stop_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(parse_config(raw), load=loader, progress=False)
    monkeypatch.setattr(runner, "compute_logits", real)
    result = run_experiment(parse_config(raw), load=loader, progress=False)
    sessions = json.loads((tmp_path / "run" / "manifest.json").read_text())["sessions"]
    assert [s["computed_this_run"] for s in sessions] == [4, len(result.results) - 4]
    assert sessions[0]["interrupted"] is True and "interrupted" not in sessions[1]
    run_experiment(parse_config(raw), load=loader, progress=False)  # a third session: nothing to do
    sessions = json.loads((tmp_path / "run" / "manifest.json").read_text())["sessions"]
    assert [s["computed_this_run"] for s in sessions] == [4, len(result.results) - 4, 0]
