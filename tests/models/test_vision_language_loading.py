"""Loading a vision-language checkpoint as a grafting run needs it: its language model alone
where transformers builds it so (the vision tower never read, the source says so), whole
elsewhere; lean donors read only the language model's tensors; the plan prices what is loaded;
a donor differing only in its vision tower is still reported, and a prompt holding an image
placeholder is refused before any model loads."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from tiny_models import VL_CONFIGS, make_donor, make_tiny, random_ids, tiny_tokenizer

import weightgraft as wg
from weightgraft.engine.architectures import adapter_for
from weightgraft.engine.architectures.vision_language import OutsideDifference, outside_differences
from weightgraft.errors import GraftArgumentError
from weightgraft.models import load_model
from weightgraft.models.footprint import location_footprint
from weightgraft.models.lean import lean_from_safetensors, memory_report, needed_parameters
from weightgraft.models.vision_language import load_form
from weightgraft.planning.lengths import refuse_media, tokenizer_for

VL = sorted(VL_CONFIGS)


def _save(model: torch.nn.Module, path: Path, tokenizer=None) -> Path:
    model.save_pretrained(path)
    (tokenizer or tiny_tokenizer()).save_pretrained(path)
    return path


def _vision_only_donor(base: torch.nn.Module) -> torch.nn.Module:
    donor = copy.deepcopy(base)
    with torch.no_grad():
        for name, p in donor.named_parameters():
            if name.startswith(adapter_for(base.config).outside):
                p.add_(0.5)
    return donor


@pytest.mark.parametrize("model_type", VL)
@torch.no_grad()
def test_a_checkpoint_loads_as_its_language_model_and_computes_the_same_logits(model_type, tmp_path):
    wrapper = make_tiny(model_type, seed=0)
    loaded = load_model(str(_save(wrapper, tmp_path / "m")))
    ids = random_ids(2, 7)
    assert torch.equal(loaded.model(input_ids=ids).logits, wrapper(input_ids=ids).logits)
    assert wg.slots(loaded.model) == wg.slots(wrapper)
    if not load_form(wrapper.config).language_model_only:  # the Qwen-VLs: no causal-LM class of the text family
        assert type(loaded.model) is type(wrapper)
        assert "loaded whole; its language model is grafted" in loaded.source
    else:
        assert not any("vision" in n or "projector" in n for n, _ in loaded.model.named_parameters())
        assert f"the language model of a {model_type} checkpoint; vision tower not loaded" in loaded.source
    fp = location_footprint(str(tmp_path / "m"))  # the plan prices what loading builds
    assert fp.n_params == sum(p.numel() for p in loaded.model.parameters())
    assert fp.slot_names == wg.slots(loaded.model)


@pytest.mark.parametrize("model_type", VL)
def test_a_donor_differing_only_in_its_vision_tower_is_reported_whole_and_lean(model_type, tmp_path):
    base_model = make_tiny(model_type, seed=0)
    base = load_model(str(_save(base_model, tmp_path / "base")))
    same = load_model(str(_save(copy.deepcopy(base_model), tmp_path / "same")))
    vision_dir = _save(_vision_only_donor(base_model), tmp_path / "vision")
    vision = load_model(str(vision_dir))
    assert outside_differences([base.model, same.model]) == []  # the null: nothing to report
    (line,) = outside_differences([base.model, vision.model])
    assert "models[1] differs from the base in" in line
    needed = needed_parameters(base.model, {"layers.1.o", "final_norm"})
    lean, _ = lean_from_safetensors(base.model, vision_dir, needed)
    assert memory_report(lean, base.model).tensors_held == 0  # its language model equals the base's
    assert len(outside_differences([base.model, lean])) == 1
    ids = random_ids(2, 7)
    every = torch.ones(2, 7, len(wg.slots(base.model)), dtype=torch.long)
    with pytest.warns(OutsideDifference):
        got = wg.graft_forward([base.model, lean], ids, every)
    with torch.no_grad():
        assert torch.equal(got, base.model(input_ids=ids).logits)


@pytest.mark.parametrize("model_type", VL)
@torch.no_grad()
def test_a_lean_donor_of_a_checkpoint_equals_the_full_donor_bit_for_bit(model_type, tmp_path):
    base_model = make_tiny(model_type, seed=0)
    base = load_model(str(_save(base_model, tmp_path / "base")))
    donor_dir = _save(make_donor(base_model, 1), tmp_path / "sft")
    full = load_model(str(donor_dir))
    mlp = "layers.1.down" if "layers.1.down" in wg.slots(base.model) else "layers.1.experts"  # Qwen3.5-MoE: a bank
    wanted = {"layers.1.o", mlp, "final_norm"}
    needed = needed_parameters(base.model, wanted)
    lean, digest = lean_from_safetensors(base.model, donor_dir, needed)
    assert digest == full.weights_sha256
    assert memory_report(lean, base.model).tensors_held == len(needed)
    names = wg.slots(base.model)
    ids = random_ids(2, 7)
    source = torch.zeros(2, 7, len(names), dtype=torch.long)
    for s in wanted:
        source[:, 3:, names.index(s)] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutsideDifference)  # make_donor moves the vision tower too
        got = wg.graft_forward([base.model, lean], ids, source)
        want = wg.graft_forward([base.model, full.model], ids, source)
    assert torch.equal(got, want)
    assert (got - base.model(input_ids=ids).logits).abs().max().item() > 1e-2


def test_a_prompt_with_an_image_placeholder_is_refused_before_any_model_loads(tmp_path):
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image = tok.convert_tokens_to_ids("<image>")
    model = make_tiny("gemma3", seed=0, vocab_size=len(tok))
    model.config.image_token_index = image
    folder = _save(model, tmp_path / "m", tok)
    fp = location_footprint(str(folder))  # reads config.json and the tokenizer; no weights
    assert fp.form.media_tokens == (image,)
    counter, how = tokenizer_for(fp)
    assert how.startswith("token counts")
    texts = ["Who starred with Tom?", "Look: <image> who is this?"]
    prompts = [(t, counter(t)["input_ids"]) for t in texts]
    refuse_media(fp, counter, prompts[:1])  # a text prompt passes
    with pytest.raises(GraftArgumentError, match="'Look: <image> who is this\\?' holds an image/video placeholder"):
        refuse_media(fp, counter, prompts)



@pytest.mark.parametrize("model_type", ["gemma3", "smolvlm"])
@torch.no_grad()
def test_a_language_model_loaded_alone_saves_as_the_text_model_it_is(model_type, tmp_path):
    """A finetune of it (``weightgraft train`` saves the model it trained) loads back as that text model."""
    wrapper = make_tiny(model_type, seed=0)
    loaded = load_model(str(_save(wrapper, tmp_path / "vl")))
    loaded.model.save_pretrained(tmp_path / "text")
    tiny_tokenizer().save_pretrained(tmp_path / "text")
    again = load_model(str(tmp_path / "text"))
    assert type(again.model) is type(loaded.model) and again.weights_sha256 == loaded.weights_sha256
    ids = random_ids(2, 7)
    assert torch.equal(again.model(input_ids=ids).logits, wrapper(input_ids=ids).logits)
    assert outside_differences([loaded.model, again.model]) == []  # a text finetune has no tower to differ in
