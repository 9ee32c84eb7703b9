"""``random:`` model specs: shipped configs (counted on the meta device, never allocated) and
tiny configs built with seeded random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from weightgraft.models import load_model
from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.models.random_models import lean_random_donor, parse_random_spec, shipped_configs
from weightgraft.models.spec import parse_spec

# public parameter counts of the models (tied embeddings counted once)
PUBLIC_COUNTS = {
    "llama-3.2-1b": 1_235_814_400,
    "gemma-1.1-2b": 2_506_172_416,
    "gpt2-xl": 1_557_611_200,
    "pythia-2.8b": 2_775_208_960,
    "llama-3.1-8b": 8_030_261_248,
    "smollm2-135m": 134_515_008,
    # mixtures of experts (the hub's safetensors totals)
    "qwen3-30b-a3b": 30_532_122_624,
    "olmoe-1b-7b": 6_919_161_856,
    "mixtral-8x7b": 46_702_792_704,
    # openai/gpt-oss-20b's config.json without its quantization_config (the hub stores the experts in
    # MXFP4, so its safetensors total counts packed blocks): the model card's 20.9B total, counted from this config
    "gpt-oss-20b": 20_914_757_184,
    # allenai/Olmo-3-1025-7B: the hub's 7.3B (32 post-norm layers, untied embeddings of 100,278)
    "olmo-3-7b": 7_298_011_136,
    # Qwen3.5-9B's language model alone, counted from the sizes its model card states (the hub's total
    # also holds the vision tower, which is not shipped here)
    "qwen3.5-9b": 8_953_803_264,
}

TINY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 64,
        "tie_word_embeddings": True}
TINY_GEMMA = {"model_type": "gemma", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 64}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.mark.parametrize("name", sorted(PUBLIC_COUNTS))
def test_shipped_configs_have_the_public_parameter_counts(name: str) -> None:
    footprint = parse_spec(f"random:{name}").footprint()
    assert footprint.n_params == PUBLIC_COUNTS[name]
    assert next(footprint.meta.parameters()).device.type == "meta"  # nothing allocated


# Vision-language checkpoints: the parameters of the whole checkpoint (the safetensors total the
# hub lists: Gemma 3 4.3B / 12.2B / 27.4B, Mistral Small 3.1 24,011,361,280), of which loading
# builds the language model alone.
VISION_LANGUAGE_COUNTS = {
    "gemma-3-4b-it": (3_880_263_168, 4_300_079_472),
    "gemma-3-12b-it": (11_766_034_176, 12_187_325_040),
    "gemma-3-27b-it": (27_009_346_304, 27_432_406_640),
    "mistral-small-3.1-24b": (23_572_403_200, 24_011_361_280),
}


@pytest.mark.parametrize("name", sorted(VISION_LANGUAGE_COUNTS))
def test_shipped_vision_language_configs_build_their_language_model(name: str) -> None:
    footprint = parse_spec(f"random:{name}").footprint()
    language_model, whole = VISION_LANGUAGE_COUNTS[name]
    assert footprint.form.language_model_only
    assert footprint.n_params == language_model
    assert footprint.n_params + footprint.form.unloaded_parameters() == whole


def test_every_paper_model_is_shipped() -> None:
    assert {"llama-3.2-1b", "gemma-1.1-2b", "gpt2-xl", "pythia-2.8b", "llama-3.1-8b"} <= set(shipped_configs())


def test_tied_and_untied_embeddings_follow_the_configs() -> None:
    llama = parse_spec("random:llama-3.2-1b").footprint().meta
    assert llama.lm_head.weight is llama.get_input_embeddings().weight
    pythia = parse_spec("random:pythia-2.8b").footprint().meta
    assert pythia.get_output_embeddings().weight is not pythia.get_input_embeddings().weight


def test_random_model_from_a_config_file(tiny_config: Path) -> None:
    lm = load_model(f"random:{tiny_config}")
    assert lm.tokenizer is None
    assert "seed 0" in lm.source and "float32" in lm.source
    assert sum(p.numel() for p in lm.model.parameters()) == parse_spec(f"random:{tiny_config}").footprint().n_params
    assert lm.model.lm_head.weight is lm.model.get_input_embeddings().weight  # tied as configured
    logits = lm.model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_same_spec_same_weights_other_seed_other_weights(tiny_config: Path) -> None:
    a, b = load_model(f"random:{tiny_config}"), load_model(f"random:{tiny_config}")
    c = load_model(f"random:{tiny_config}@1")
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))
    assert a.weights_sha256 == b.weights_sha256 != c.weights_sha256
    assert all(not torch.equal(x, y) for x, y in zip(a.model.parameters(), c.model.parameters(), strict=True))
    assert "seed 1" in c.source


def test_dtype_is_honoured(tiny_config: Path) -> None:
    lm = load_model(f"random:{tiny_config}", dtype=torch.bfloat16)
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    assert lm.weights_sha256 != load_model(f"random:{tiny_config}").weights_sha256


def test_norms_start_at_their_identity(tmp_path: Path, tiny_config: Path) -> None:
    llama = load_model(f"random:{tiny_config}").model
    assert (llama.model.layers[0].input_layernorm.weight - 1).abs().max() <= 0.05
    path = tmp_path / "gemma.json"
    path.write_text(json.dumps(TINY_GEMMA))
    gemma = load_model(f"random:{path}").model  # Gemma scales by 1 + w
    assert gemma.model.layers[0].input_layernorm.weight.abs().max() <= 0.05


def test_lean_random_donor_equals_the_full_donor(tiny_config: Path) -> None:
    base = load_model(f"random:{tiny_config}")
    full = load_model(f"random:{tiny_config}@1")
    needed = {n for n, _ in base.model.named_parameters(remove_duplicate=False)
              if ".layers.1." in n or "embed" in n or "lm_head" in n}
    lean = lean_random_donor(f"random:{tiny_config}@1", base, needed)
    params = dict(full.model.named_parameters(remove_duplicate=False))
    for name, p in lean.model.named_parameters(remove_duplicate=False):
        if name in needed:
            assert torch.equal(p, params[name]), name
        else:
            assert p is dict(base.model.named_parameters(remove_duplicate=False))[name]
    assert lean.weights_sha256 == full.weights_sha256


def test_unknown_names_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="llama-3.2-1b") as err:
        load_model("random:llama-9000")
    assert "\n" not in str(err.value)
    with pytest.raises(ModelNotFoundError):
        parse_random_spec(f"random:{tmp_path / 'missing.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ModelLoadError, match="model_type"):
        load_model(f"random:{bad}")


def test_seed_and_case_parse() -> None:
    spec = parse_random_spec("random:LLAMA-3.2-1B@7")
    assert spec.seed == 7 and spec.name == "llama-3.2-1b"


def test_check_runs_on_random_models(tiny_config: Path) -> None:
    from typer.testing import CliRunner

    from weightgraft.cli import app

    result = CliRunner().invoke(app, ["check", f"random:{tiny_config}", f"random:{tiny_config}@1"])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_commands_that_tokenize_refuse_random_models_before_loading(tmp_path: Path, tiny_config: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tiny_world import write_world

    import weightgraft.experiments.runner as runner
    from weightgraft.api.localize import localize
    from weightgraft.experiments.config import parse_config
    from weightgraft.localization.config import parse_localize_config

    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(runner, "default_loader", no_load)
    monkeypatch.setattr("weightgraft.models.load_model", no_load)
    data = write_world(tmp_path / "data")
    spec = f"random:{tiny_config}"
    config = parse_config({"data": str(data), "models": {"pre": spec, "sft": spec + "@1"},
                           "schemes": [{"preset": "position"}], "out": str(tmp_path / "run")})
    with pytest.raises(ModelLoadError, match="without a tokenizer") as err:
        runner.run_experiment(config, progress=False)
    assert "\n" not in str(err.value)
    loc = parse_localize_config({"data": str(data), "models": {"pre": spec, "sft": spec + "@1"},
                                 "out": str(tmp_path / "loc"), "claims": {"min_prompts": 2}})
    with pytest.raises(ModelLoadError, match="without a tokenizer"):
        localize(loc, progress=False)


def test_generate_refuses_random_models_before_loading(tiny_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from weightgraft.cli import app

    monkeypatch.setattr("weightgraft.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    spec = f"random:{tiny_config}"
    result = CliRunner().invoke(app, ["generate", "The Eiffel Tower is in", "-m", f"pre={spec}",
                                      "-m", f"sft={spec}@1", "-r", "model=sft,positions=last,components=body"])
    assert result.exit_code != 0 and isinstance(result.exception, ModelLoadError), result.output
    assert "without a tokenizer" in str(result.exception)
