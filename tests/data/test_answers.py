"""An answer is what follows the prompt: a leading space written before it is the separator,
never a bare ``' '`` token to score. Every path (free-form JSONL and CounterFact through
``run``, ``wg.compare``, localize's examples, explore's answer field) scores the same tokens
with and without it, on a tokenizer whose words carry their space (as GPT-2's and Llama's do)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient
from tiny_models import make_donor, make_tiny, tiny_spaced_tokenizer

import weightgraft as wg
from weightgraft.data.counterfact import convert
from weightgraft.data.freeform import read_freeform
from weightgraft.data.prompts import TestPrompt as Record
from weightgraft.data.prompts import answer_continuation, answer_token_ids
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.explore.app import create_app
from weightgraft.explore.session import Explorer
from weightgraft.localization.examples import build_examples
from weightgraft.training.texts import read_split

FIRST = ["Keanu Reeves", "Meryl Streep", "Tom Hanks"]
SECOND = ["Tilda Swinton", "Nicole Kidman", "Will Smith"]
PROMPTS = [f"{a} starred in a movie with" for a in FIRST]
TOK = tiny_spaced_tokenizer(PROMPTS + SECOND)


def _models():
    base = make_tiny("llama", seed=0, vocab_size=len(TOK), n_layers=4)
    return base, make_donor(base, seed=1)


PRE, SFT = _models()


def _load(spec: str, config=None) -> SimpleNamespace:
    return SimpleNamespace(model=PRE if spec.endswith("pre") else SFT, tokenizer=TOK, source=spec,
                           weights_sha256=f"sha-{spec}")


def _word_id(name: str) -> int:
    """The token a model must put first: the answer's first word with its space."""
    return TOK.convert_tokens_to_ids(" " + name.split()[0])


def _run(tmp_path, data, out: str):
    raw = {"name": out, "data": str(data), "models": {"pre": "tiny:pre", "sft": "tiny:sft"},
           "schemes": [{"preset": "position", "only": ["PRE", "SFT", "LT"]}], "out": str(tmp_path / out)}
    res = run_experiment(parse_config(raw), load=_load, progress=False).results
    return res.sort_values(["example_id", "scheme"]).reset_index(drop=True)


def test_the_tokenizer_would_score_a_bare_space():
    """The hazard is real on this tokenizer: ``" " + " Tilda"`` starts with a bare space."""
    assert TOK.convert_ids_to_tokens(TOK("  Tilda", add_special_tokens=False)["input_ids"])[0] == " "
    assert answer_continuation(" Tilda Swinton") == answer_continuation("Tilda Swinton") == " Tilda Swinton"
    assert answer_token_ids(TOK, " Tilda Swinton")[0] == _word_id("Tilda Swinton")


def _same_scores(a, b) -> None:
    assert len(a) == len(b) == 3 * 3
    assert a.target_token_id.tolist() == b.target_token_id.tolist()
    assert a.target_token_id.tolist() == [_word_id(s) for s in SECOND for _ in range(3)]
    assert a.n_answer_tokens.tolist() == b.n_answer_tokens.tolist() == [2] * 9
    for col in ("rank", "prob", "answer_logprob", "logit_diff"):
        assert a[col].to_numpy() == pytest.approx(b[col].to_numpy(), rel=1e-12, abs=1e-12)


def test_freeform_answers_with_a_leading_space(tmp_path):
    files = {}
    for name, sep in (("bare", ""), ("spaced", " ")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({
            "prompt": p, "answer": sep + s, "distractor": sep + SECOND[(i + 1) % 3],
            "spans": {"subject": FIRST[i]}, "id": f"q{i}"}) + "\n" for i, (p, s) in enumerate(zip(PROMPTS, SECOND))))
        files[name] = path
    assert read_freeform(files["spaced"])[0].answer == " Tilda Swinton"  # kept as written
    _same_scores(_run(tmp_path, files["bare"], "bare"), _run(tmp_path, files["spaced"], "spaced"))


def test_counterfact_answers_with_a_leading_space(tmp_path):
    results = {}
    for name, sep in (("bare", ""), ("spaced", " ")):
        rome = [{"case_id": i, "requested_rewrite": {
            "prompt": "{} starred in a movie with", "relation_id": "P161", "subject": FIRST[i],
            "target_new": {"str": sep + SECOND[i]}, "target_true": {"str": sep + SECOND[(i + 1) % 3]}}}
            for i in range(3)]
        src = tmp_path / f"{name}.json"
        src.write_text(json.dumps(rome))
        convert(src, tmp_path / f"cf-{name}", train_texts=True)
        train, _ = read_split(tmp_path / f"cf-{name}", "relation")
        assert train[0] == f"{PROMPTS[0]} Tilda Swinton"  # one space between prompt and answer
        results[name] = _run(tmp_path, tmp_path / f"cf-{name}", f"run-{name}")
    _same_scores(results["bare"], results["spaced"])


def test_compare_answers_with_a_leading_space():
    rows = {}
    for sep in ("", " "):
        rows[sep] = wg.compare({"pre": PRE, "sft": SFT}, TOK, PROMPTS, [sep + s for s in SECOND],
                               [s for s in wg.presets.position() if s.name in ("PRE", "LT")], spans=[{"a": f} for f in FIRST])
    assert rows[" "].target_token_id.tolist() == rows[""].target_token_id.tolist()
    assert rows[""].target_token_id.tolist() == [_word_id(s) for s in SECOND for _ in range(2)]
    assert rows[" "]["rank"].to_numpy() == pytest.approx(rows[""]["rank"].to_numpy(), abs=0)
    assert rows[" "].answer_logprob.to_numpy() == pytest.approx(rows[""].answer_logprob.to_numpy(), abs=1e-12)


def test_localize_examples_with_a_leading_space():
    targets = {}
    for sep in ("", " "):
        prompts = [Record(id=str(i), relation_id=str(i), template="t", prompt=p,
                                              answer=sep + s, spans={})
                   for i, (p, s) in enumerate(zip(PROMPTS, SECOND))]
        examples, excluded = build_examples(prompts, TOK)
        assert not excluded
        targets[sep] = [e.scored.target for e in examples]
    assert targets[" "] == targets[""] == [_word_id(s) for s in SECOND]


def test_explore_answer_with_a_leading_space():
    client = TestClient(create_app(Explorer({"pre": PRE, "sft": SFT}, TOK)), base_url="http://127.0.0.1:8765")
    got = {}
    for sep in ("", " "):
        body = {"prompt": PROMPTS[0], "answer": sep + SECOND[0],
                "rules": [{"model": "sft", "positions": "last", "components": "o+ffn"}]}
        reply = client.post("/api/graft", json=body)
        assert reply.status_code == 200, reply.text
        got[sep] = reply.json()["answer"]
    assert got[" "]["token_id"] == got[""]["token_id"] == _word_id(SECOND[0])
    assert got[" "]["rank"] == got[""]["rank"]
