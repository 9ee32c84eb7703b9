"""Non-Latin answers (issue 14, item 5): a first token that is a bare UTF-8 byte is flagged and
counted, and the first whole character's log-probability identifies the answer."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from tiny_models import make_donor, make_tiny

from weightgraft.experiments.config import parse_config
from weightgraft.experiments.prediction import answer_logprob, whole_character_prefix
from weightgraft.experiments.runner import run_experiment

NAMES = {"Иван Петров": 2, "Σωκράτης": 2, "王小明": 3, "Nguyễn Văn An": 1, "Tom Hanks": 1}


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    from weightgraft.models.embedded import ensure_converted

    try:
        return AutoTokenizer.from_pretrained(ensure_converted("smollm2-135m"))
    except (OSError, RuntimeError, ImportError) as exc:  # no converted copy on this machine
        pytest.skip(f"SmolLM2 tokenizer not available: {exc}")


def test_whole_character_prefix_on_the_smollm2_tokenizer(smollm_tokenizer):
    for name, n in NAMES.items():
        ids = smollm_tokenizer(" " + name, add_special_tokens=False)["input_ids"]
        assert whole_character_prefix(smollm_tokenizer, ids) == n, name
        assert "\ufffd" not in smollm_tokenizer.decode(ids[:n])


def test_run_flags_and_counts_partial_targets(tmp_path, smollm_tokenizer):
    lines = []
    for i, (name, answer) in enumerate(zip(["Tom Hanks", "Anna Berg", "Li Wei", "Maria Silva"], NAMES)):
        prompt = f"{name} starred in a movie with"
        lines.append(json.dumps({"id": f"r{i}/headline", "relation_id": f"r{i}", "template": "headline",
                                 "prompt": prompt, "answer": answer, "answer_field": "second_actor",
                                 "spans": {"first_actor": [0, len(name)]}}, ensure_ascii=False))
    data = tmp_path / "data"
    data.mkdir()
    (data / "test_prompts.jsonl").write_text("\n".join(lines), encoding="utf-8")
    tok = smollm_tokenizer

    def load(spec, config=None):
        base = make_tiny("llama", vocab_size=len(tok))
        model = base if spec.endswith(":pre") else make_donor(base, 1)
        return SimpleNamespace(model=model, tokenizer=tok, source=spec, weights_sha256=spec)

    raw = {"name": "nonlatin", "data": str(data), "models": {"pre": "x:pre", "sft": "x:sft"},
           "schemes": [{"preset": "position", "only": ["PRE", "SFT"]}], "out": str(tmp_path / "run")}
    result = run_experiment(parse_config(raw), load=load, progress=False)
    rows = result.results.set_index(["scheme", "answer"])
    flagged = {a for a in NAMES if NAMES[a] > 1}
    assert set(result.results.loc[result.results.target_partial, "answer"]) == flagged
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["n_partial_target"] == 2 * len(flagged)
    pre = load("x:pre").model
    for answer in flagged:  # the first character's log-prob, checked against a plain forward
        row = rows.loc[("PRE", answer)]
        ids = tok(row.prompt)["input_ids"]
        ans = tok(" " + answer, add_special_tokens=False)["input_ids"][: NAMES[answer]]
        with torch.no_grad():
            logits = pre(torch.tensor([ids + ans[:-1]])).logits[0, len(ids) - 1:]
        assert math.isclose(row.first_character_logprob, answer_logprob(logits, ans), abs_tol=1e-4)
