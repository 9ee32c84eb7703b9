"""Fact-specific effects: ``fact_logprob`` is the answer's log-probability minus the mean over the
world's other answers (the same template and answer field), on the same pass, so a donor that
raises every answer alike moves it by 0 and no fact claim can hold on it, while the plain
``first_logprob`` lets such a donor pass. The claims' numbers in this metric equal direct grafts
(float64), and the contrast each prompt carries is the other answers' first tokens."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import make_donor, make_tiny
from tiny_world import tokenizer, write_world

import weightgraft as wg
from weightgraft.engine.cells import ScoredExample, contrast_tokens
from weightgraft.engine.metric_table import Batch, fact_logprob
from weightgraft.errors import GraftArgumentError
from weightgraft.localization.claims.stage import map_claims
from weightgraft.localization.claims.verdicts import decide
from weightgraft.localization.config import ClaimSettings, parse_localize_config
from weightgraft.localization.examples import build_examples
from weightgraft.localization.prompts import select_prompts

FACT_CLAIMS = ("fe_lt", "enrichment", "recall")


def test_fact_logprob_is_the_answer_against_the_mean_of_the_other_answers() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, generator=gen, dtype=torch.float64) * 4
    targets = torch.tensor([2, 5, 7])
    others = torch.tensor([[3, 4, -1], [1, 2, 9], [0, -1, -1]])
    got = fact_logprob(Batch(logits, targets, others))
    logp = torch.log_softmax(logits, -1)
    want = torch.stack([logp[0, 2] - logp[0, [3, 4]].mean(), logp[1, 5] - logp[1, [1, 2, 9]].mean(),
                        logp[2, 7] - logp[2, 0]])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    raised = logits.clone()  # every answer raised alike (each row by its own amount): no change
    for row, cols in enumerate([[2, 3, 4], [5, 1, 2, 9], [7, 0]]):
        raised[row, cols] += 3.0 + row
    torch.testing.assert_close(fact_logprob(Batch(raised, targets, others)), got, rtol=0, atol=1e-12)
    with pytest.raises(GraftArgumentError, match="other answer"):
        fact_logprob(Batch(logits, targets, torch.tensor([[3], [-1], [0]])))


def test_each_prompt_carries_the_other_answers_of_its_template(tmp_path) -> None:
    tok = tokenizer()
    config = parse_localize_config({"data": str(write_world(tmp_path / "data", n=5)), "models": {"pre": "x", "sft": "y"}})
    examples, excluded = build_examples(select_prompts(config), tok)
    assert not excluded and len(examples) == 10
    for e in examples:
        same = {f.scored.target for f in examples if f.prompt.template == e.prompt.template}
        assert set(e.scored.other_answers) == same - {e.scored.target}
        assert e.scored.target not in e.scored.other_answers
    lonely = ScoredExample((1, 2), 1, target=3)
    with pytest.raises(GraftArgumentError, match="other answers"):
        contrast_tokens([lonely], "fact_logprob")


def _world(tmp_path, n: int):
    tok = tokenizer()
    config = parse_localize_config({"data": str(write_world(tmp_path / "data", n=n)), "templates": ["headline"],
                                    "models": {"pre": "x", "sft": "y"}})
    examples, _ = build_examples(select_prompts(config), tok)
    return tok, examples


def _claims(models, examples, metric: str, tmp_path) -> pd.DataFrame:
    from test_localize_claims import _no_estimates

    (tmp_path / metric).mkdir(exist_ok=True)
    table, _ = map_claims(models, examples, _no_estimates(), model_label="sft", direction="sufficiency", setting="pre->sft",
                          settings=ClaimSettings(null_draws=5, resamples=999, min_prompts=2, metric=metric), seed=0, pad_id=0,
                          metric="first_logprob",
                          chunk=64, parts=tmp_path / metric, say=lambda *a: None)
    return decide(table).set_index("claim")  # this map as the family


def _answer_raiser(pre: torch.nn.Module, examples) -> torch.nn.Module:
    """PRE with one vector added to the unembedding row of every answer's first token: each
    answer's logit moves by the same amount on any pass (it knows no fact, it raises them all).
    The vector is PRE's mean last hidden state at the prompts' last tokens, so the answers rise."""
    donor = copy.deepcopy(pre)
    head = donor.get_output_embeddings().weight
    answers = sorted({e.scored.target for e in examples})
    with torch.no_grad():
        states = [pre(torch.tensor([e.scored.input_ids]), output_hidden_states=True).hidden_states[-1][0, -1]
                  for e in examples]
        direction = torch.stack(states).mean(0)
        head[answers] += 3.0 * direction / direction.norm()
    return donor


@pytest.mark.slow
def test_a_donor_that_raises_every_answer_alike_makes_no_fact_claim_hold(tmp_path) -> None:
    tok, examples = _world(tmp_path, n=12)
    pre = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=5, tied=False).double()
    raiser = _answer_raiser(pre, examples)
    plain = _claims([pre, raiser], examples, "first_logprob", tmp_path)
    fact = _claims([pre, raiser], examples, "fact_logprob", tmp_path)
    print(plain.loc[list(FACT_CLAIMS), ["share_exact", "ci_low", "ci_high", "null_p", "verdict", "reason"]])
    print(fact.loc[list(FACT_CLAIMS), ["whole_effect", "share_exact", "verdict", "reason"]])
    assert (plain.loc[["fe_lt", "recall"], "verdict"] == "holds").all()  # the plain effect is fooled
    assert (fact.loc[list(FACT_CLAIMS), "verdict"] == "no effect").all()
    # the plain effect beside the fact one, from the same passes, is the plain run's
    np.testing.assert_allclose(fact["share_plain"].to_numpy(float), plain["share_exact"].to_numpy(float), rtol=0, atol=1e-9)
    assert np.abs(fact.loc[list(FACT_CLAIMS), "whole_effect"].to_numpy()).max() < 1e-9


def test_fact_claims_equal_direct_grafts_of_the_fact_metric(tmp_path) -> None:
    """From the localize path in float64: ``recall``'s share in ``fact_logprob`` equals wg.graft of
    the last token over the whole graft, each read as the answer against the other answers."""
    tok, examples = _world(tmp_path, n=4)
    pre = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=5).double()
    sft = make_donor(pre, 1).double()
    rows = _claims([pre, sft], examples, "fact_logprob", tmp_path)
    prompts = [e.prompt.prompt for e in examples]
    targets = torch.tensor([e.scored.target for e in examples])
    others = contrast_tokens([e.scored for e in examples], "fact_logprob")

    def fact(rules) -> torch.Tensor:
        out = wg.graft({"pre": pre, "sft": sft}, tok, prompts, rules)
        logp = torch.log_softmax(out.logits.double(), -1)
        mean = torch.stack([logp[i, o[o >= 0]].mean() for i, o in enumerate(others)])
        return logp[torch.arange(len(prompts)), targets] - mean

    base = fact([])
    whole = (fact(wg.Rule(model="sft", components="all")) - base).sum()
    last = (fact(wg.Rule(model="sft", positions="last", components="all")) - base).sum()
    assert rows.loc["recall", "share_exact"] == pytest.approx(float(last / whole), abs=1e-10)


def test_a_template_whose_answers_share_a_first_token_is_not_judged_and_says_so(tmp_path) -> None:
    from dataclasses import replace

    from test_localize_claims import _no_estimates

    from weightgraft.localization.examples import LocalizeExample

    tok, examples = _world(tmp_path, n=4)
    alone = [LocalizeExample(e.prompt, replace(e.scored, other_answers=()), e.labels) for e in examples]
    pre = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=5).double()
    said: list[str] = []
    table, per = map_claims([pre, make_donor(pre, 1).double()], alone, _no_estimates(), model_label="sft",
                            direction="sufficiency", setting="pre->sft", settings=ClaimSettings(min_prompts=2, null_draws=3,
                                                                                                resamples=99),
                            seed=0, pad_id=0, metric="first_logprob", chunk=64, parts=tmp_path, say=said.append)
    assert table.empty and per.empty
    assert any("claims not judged in fact_logprob: 4 of 4 prompt(s)" in line for line in said)


def test_a_runs_rows_carry_the_fact_metric_and_an_answer_raiser_moves_it_by_nothing(tmp_path) -> None:
    """``weightgraft run``'s rows: ``fact_logprob`` is logit[answer] - mean logit[other answers of the
    template] on the row's pass; the answer raiser as the whole model moves every answer's first
    log-probability, and its fact log-probability by nothing."""
    from types import SimpleNamespace

    from tiny_world import tiny_config

    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment

    tok, examples = _world(tmp_path, n=12)
    pre = make_tiny("llama", seed=0, vocab_size=len(tok), n_layers=5, tied=False).double()
    models = {"tiny:pre": pre, "tiny:sft": _answer_raiser(pre, examples)}

    def load(spec: str, config=None) -> SimpleNamespace:
        return SimpleNamespace(model=models[spec], tokenizer=tok, source=spec, weights_sha256=f"sha-{spec}")

    raw = tiny_config(tmp_path, "fact", world={"n": 12}, templates=["headline"],
                      models={"pre": "tiny:pre", "sft": "tiny:sft"}, schemes=[{"name": "PRE"}, {"name": "LT", "rules": [
                          {"model": "sft", "positions": "last", "components": "body+unembed"}]}])
    rows = run_experiment(parse_config(raw), load=load, progress=False).results
    firsts = {e.prompt.id: e.scored.target for e in examples}
    for _, row in rows[rows.scheme == "LT"].iterrows():
        logits = models["tiny:sft"](torch.tensor([tok(row.prompt)["input_ids"]])).logits[0, -1]
        others = sorted(set(firsts.values()) - {firsts[row.example_id]})
        want = (logits[firsts[row.example_id]] - logits[others].mean()).item()
        assert abs(row.fact_logprob - want) < 1e-4  # rows hold float32 logits
    by = rows.pivot(index="example_id", columns="scheme", values=["fact_logprob", "first_logprob"])
    assert (by["first_logprob"]["LT"] - by["first_logprob"]["PRE"]).abs().min() > 0.05
    assert (by["fact_logprob"]["LT"] - by["fact_logprob"]["PRE"]).abs().max() < 1e-4
