"""``run`` and ``localize`` on vision-language checkpoint folders, as a user gives them: the
paper's position sweep on a Gemma 3 4B-style checkpoint (a tiny one) gives the rows the same
sweep gives on the text-only model holding the same language-model weights, and localize runs
on it end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as T
from tiny_models import make_donor, make_tiny
from tiny_world import tiny_config, tokenizer, write_world

from weightgraft.api.localize import localize
from weightgraft.engine.architectures import wrapper_of
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.localization.config import parse_localize_config
from weightgraft.models.vision_language import load_form


def _text_twin(wrapper: torch.nn.Module) -> torch.nn.Module:
    form = load_form(wrapper.config)
    text = T.AutoModelForCausalLM.from_config(form.config).eval()
    root = f"{wrapper_of(wrapper.config).language_model}."
    state = {k.replace(root, "model."): v for k, v in wrapper.state_dict().items() if k.startswith((root, "lm_head."))}
    text.load_state_dict(state, strict=not form.config.tie_word_embeddings)
    return text


@pytest.fixture(scope="module")
def gemma3_dirs(tmp_path_factory) -> dict[str, str]:
    """A tiny Gemma 3 vision-language pair and its text-only twins, saved with their tokenizer."""
    root = tmp_path_factory.mktemp("gemma3_vl")
    tok = tokenizer()
    base = make_tiny("gemma3", seed=0, vocab_size=len(tok))
    out = {}
    for role, model in (("pre", base), ("sft", make_donor(base, 1))):
        for kind, saved in (("vl", model), ("text", _text_twin(model))):
            saved.save_pretrained(root / f"{kind}-{role}")
            tok.save_pretrained(root / f"{kind}-{role}")
            out[f"{kind}-{role}"] = str(root / f"{kind}-{role}")
    return out


@pytest.mark.slow
def test_a_position_sweep_on_a_checkpoint_equals_the_sweep_on_its_language_model(tmp_path, gemma3_dirs):
    results = {}
    for kind in ("vl", "text"):
        raw = tiny_config(tmp_path / kind, f"position-{kind}", world={"n": 3}, batch_size=4,
                          models={"pre": gemma3_dirs[f"{kind}-pre"], "sft": gemma3_dirs[f"{kind}-sft"]})
        results[kind] = run_experiment(parse_config(raw), progress=False).results
    vl, text = (results[k].sort_values(["example_id", "scheme"]).reset_index(drop=True) for k in ("vl", "text"))
    assert len(vl) == len(text) == 3 * 2 * 8  # 3 relations x 2 templates x the 8 position schemes
    assert vl["scheme"].tolist() == text["scheme"].tolist()
    assert vl["rank"].tolist() == text["rank"].tolist()
    assert (vl["prob"] - text["prob"]).abs().max() <= 1e-6 and (vl["answer_logprob"] - text["answer_logprob"]).abs().max() <= 1e-5
    assert vl["prob"].nunique() > 8  # the schemes moved the answer


@pytest.mark.slow
def test_localize_runs_on_a_checkpoint(tmp_path, gemma3_dirs):
    data = write_world(tmp_path / "data", n=3)
    config = parse_localize_config({
        "data": str(data), "models": {"pre": gemma3_dirs["vl-pre"], "sft": gemma3_dirs["vl-sft"]},
        "out": str(tmp_path / "run"), "exact": 1, "report": False, "batch_size": 3,
        "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"enabled": False}})
    result = localize(config, progress=False)
    assert Path(result.run_dir).is_dir()
    assert result.cells["example_id"].nunique() == 6
    assert result.cells["exact"].notna().any()
