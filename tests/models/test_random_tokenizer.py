"""``tokenizer:`` in a config: ``random:NAME`` models (no tokenizer of their own) run end to end
with a local tokenizer whose vocabulary fits; one that does not fit is refused in one line
before any model loads."""

from __future__ import annotations

import copy

import pytest
from tiny_models import TINY_CONFIGS, tiny_tokenizer
from tiny_world import tiny_config

from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.models.errors import ModelLoadError
from weightgraft.models.tokenization import TokenizerMismatchError, load_tokenizer

VOCAB = 200  # above the character tokenizer's size, below the byte fallback's 259


@pytest.fixture(scope="module")
def random_specs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("random")
    config = copy.deepcopy(TINY_CONFIGS["llama"])
    config.vocab_size, config.num_hidden_layers = VOCAB, 4
    config.save_pretrained(root / "arch")
    tiny_tokenizer().save_pretrained(root / "tok")
    path = root / "arch" / "config.json"
    return {"pre": f"random:{path}", "sft": f"random:{path}@1", "tokenizer": str(root / "tok")}


def _raw(tmp_path, specs, **extra) -> dict:
    return tiny_config(tmp_path, "rand", world={"n": 2}, models={"pre": specs["pre"], "sft": specs["sft"]},
                       schemes=[{"preset": "position", "only": ["PRE", "SFT", "FE", "LT"]}], **extra)


def test_a_random_pair_runs_with_a_tokenizer_that_fits(tmp_path, random_specs):
    with pytest.raises(ModelLoadError, match="a random model without a tokenizer"):
        run_experiment(parse_config(_raw(tmp_path, random_specs)), progress=False)
    result = run_experiment(parse_config(_raw(tmp_path, random_specs, tokenizer=random_specs["tokenizer"])),
                            progress=False)
    res = result.results
    assert len(res) == 2 * 2 * 4 and res["finite"].all()
    tok = load_tokenizer(random_specs["tokenizer"])
    first = res.iloc[0]
    assert first.target_token_id == tok(" " + first.answer, add_special_tokens=False)["input_ids"][0]
    pre = res[res.scheme == "PRE"].set_index("example_id")["prob"]
    sft = res[res.scheme == "SFT"].set_index("example_id")["prob"]
    assert (pre - sft).abs().max() > 1e-6  # two models (seeds 0 and 1), not one twice


def test_a_tokenizer_that_does_not_fit_is_refused_before_loading(tmp_path, random_specs):
    raw = _raw(tmp_path, random_specs, tokenizer="bytes")
    with pytest.raises(TokenizerMismatchError, match=f"tokenizer 'bytes' has 259 tokens but model 'default/pre' has a vocabulary of {VOCAB}"):
        run_experiment(parse_config(raw), progress=False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ModelLoadError, match="no tokenizer there"):
        load_tokenizer(str(tmp_path / "nothing"))


def test_the_byte_fallback_round_trips_text_with_offsets():
    tok = load_tokenizer("bytes")
    text = "Keanu Reeves starred in Amélie"
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    assert tok.decode(enc["input_ids"]) == text and len(tok) == 259
    assert text[enc["offset_mapping"][0][0]:enc["offset_mapping"][5][1]] == "Keanu "


@pytest.mark.slow
def test_localize_runs_on_a_random_pair_with_a_tokenizer(tmp_path, random_specs):
    from tiny_world import write_world

    from weightgraft.api.localize import localize as run_localize
    from weightgraft.localization.config import parse_localize_config

    raw = {"name": "loc", "data": str(write_world(tmp_path / "data", n=2)),
           "models": {"pre": random_specs["pre"], "sft": random_specs["sft"]}, "out": str(tmp_path / "loc"),
           "batch_size": 4, "exact": 1, "report": False, "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}}
    with pytest.raises(ModelLoadError, match="a random model without a tokenizer"):
        run_localize(parse_localize_config(raw), progress=False)
    with pytest.raises(TokenizerMismatchError, match="tokenizer 'bytes' has 259 tokens"):
        run_localize(parse_localize_config({**raw, "tokenizer": "bytes"}), progress=False)
    result = run_localize(parse_localize_config({**raw, "tokenizer": random_specs["tokenizer"]}), progress=False)
    cells = __import__("pandas").read_parquet(result.run_dir / "cells.parquet")
    assert len(cells) and cells["estimate"].notna().all() and cells["exact"].notna().any()
