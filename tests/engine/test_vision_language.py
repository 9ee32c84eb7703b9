"""Vision-language checkpoints (Gemma 3 4B-27B, Mistral Small 3.1, LLaVA, Qwen3-VL): their language
model grafts exactly as its text family does, under the same slot names; what no text prompt
reaches (the vision tower, the projector) is in no slot, and a donor differing there is reported;
a prompt holding an image placeholder is refused. The architecture matrix (test_engine.py,
test_float64.py) runs every wrapper against the per-token definition."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as T
from tiny_models import VL_CONFIGS, make_donor, make_tiny, random_ids

import weightgraft as wg
from weightgraft.engine.architectures import (
    UnsupportedArchitectureError,
    adapter_for,
    model_slots,
    supported_model_types,
    wrapper_of,
)
from weightgraft.engine.architectures.vision_language import OutsideDifference, outside_differences
from weightgraft.errors import GraftArgumentError
from weightgraft.models.vision_language import load_form

VL = sorted(VL_CONFIGS)
TEXT_ONLY = [m for m in VL if load_form(VL_CONFIGS[m]).language_model_only]


def _text_twin(wrapper: torch.nn.Module) -> torch.nn.Module:
    """The text family's causal LM holding the wrapper's language-model weights."""
    form = load_form(wrapper.config)
    text = T.AutoModelForCausalLM.from_config(form.config).to(wrapper.dtype).eval()
    root = f"{wrapper_of(wrapper.config).language_model}."
    state = {k.replace(root, "model."): v for k, v in wrapper.state_dict().items() if k.startswith((root, "lm_head."))}
    text.load_state_dict(state, strict=not form.config.tie_word_embeddings)
    return text


def _padded(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = random_ids(3, 8, seed)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, -2:] = 0  # right padding
    return ids, mask


def test_the_wrappers_of_every_admitted_text_family_are_supported():
    assert set(VL) <= set(supported_model_types())
    assert set(VL) - set(TEXT_ONLY) == {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}  # no causal-LM class: loaded whole


@pytest.mark.parametrize("model_type", TEXT_ONLY)
@torch.no_grad()
def test_the_wrappers_graft_equals_the_text_only_models_bit_for_bit(model_type):
    wrappers = [make_tiny(model_type, seed=0)]
    wrappers += [make_donor(wrappers[0], seed=i) for i in (1, 2)]
    texts = [_text_twin(w) for w in wrappers]
    assert wg.slots(wrappers[0]) == wg.slots(texts[0])  # one slot vocabulary: a scheme runs on both
    ids, mask = _padded()
    n = len(wg.slots(texts[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutsideDifference)  # make_donor moves the vision tower too
        for seed in range(2):
            source = torch.randint(0, 3, (*ids.shape, n), generator=torch.Generator().manual_seed(seed))
            got = wg.graft_forward(wrappers, ids, source, attention_mask=mask)
            want = wg.graft_forward(texts, ids, source, attention_mask=mask)
            assert torch.equal(got, want)
            assert (got - wg.graft_forward(wrappers[:1], ids, torch.zeros_like(source), attention_mask=mask)
                    ).abs().max().item() > 1e-2  # the graft moved the logits


@pytest.mark.parametrize("model_type", VL)
@torch.no_grad()
def test_a_uniform_map_reproduces_each_wrapper_bit_for_bit(model_type):
    base = make_tiny(model_type, seed=0)
    models = [base, make_donor(base, 1), make_donor(base, 2)]
    ids = random_ids(2, 7)
    shape = (2, 7, len(wg.slots(base)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutsideDifference)
        for m, model in enumerate(models):
            assert torch.equal(wg.graft_forward(models, ids, torch.full(shape, m)), model(input_ids=ids).logits)


def _vision_only_donor(base: torch.nn.Module) -> torch.nn.Module:
    donor = copy.deepcopy(base)
    outside = adapter_for(base.config).outside
    with torch.no_grad():
        for name, p in donor.named_parameters():
            if name.startswith(outside):
                p.add_(0.5)
    return donor


@pytest.mark.parametrize("model_type", VL)
@torch.no_grad()
def test_the_vision_tower_is_in_no_slot_and_a_donor_differing_there_is_reported(model_type):
    base = make_tiny(model_type, seed=0)
    outside = adapter_for(base.config).outside
    in_slots = {p.path for s in model_slots(base) for p in s.parts}
    assert outside and not any(path.startswith(outside) for path in in_slots)
    assert any(n.startswith(outside) for n, _ in base.named_parameters())  # the tower is there

    ids = random_ids(2, 7)
    n = len(wg.slots(base))
    every = torch.ones(2, 7, n, dtype=torch.long)  # every slot from the donor
    same = copy.deepcopy(base)  # the null: a donor equal outside the language model
    assert outside_differences([base, same]) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutsideDifference)
        wg.graft_forward([base, same], ids, every)

    donor = _vision_only_donor(base)
    (line,) = outside_differences([base, donor])
    assert "models[1]" in line and "no text prompt reaches" in line and line.split(" in ")[1].startswith(outside)
    with pytest.warns(OutsideDifference, match="no text prompt reaches"):
        got = wg.graft_forward([base, donor], ids, every)
    assert torch.equal(got, base(input_ids=ids).logits)  # a text prompt never sees the difference


@pytest.mark.parametrize("model_type", VL)
def test_a_prompt_with_an_image_placeholder_is_refused(model_type):
    base = make_tiny(model_type, seed=0)
    image = next(getattr(base.config, a) for a in ("image_token_id", "image_token_index")
                 if isinstance(getattr(base.config, a, None), int))
    ids = torch.tensor([[5, 9, image, 7]])
    with pytest.raises(GraftArgumentError, match=f"prompt 0 holds an image/video placeholder token \\(id {image}\\) at position 2"):
        wg.graft_forward([base], ids, torch.zeros(1, 4, len(wg.slots(base)), dtype=torch.long))
    # a padded position holding the id is no prompt token: not refused
    mask = torch.tensor([[1, 1, 0, 0]])
    wg.graft_forward([base], torch.tensor([[5, 9, 7, 7]]), torch.zeros(1, 4, len(wg.slots(base)), dtype=torch.long),
                     attention_mask=mask)


def test_a_checkpoint_whose_language_model_is_not_supported_is_refused_naming_it():
    adapter_for(T.Gemma4Config())  # Gemma 4's language model, gemma4_text, is admitted (its defaults: E2B's shapes)
    moe = T.Gemma4Config(text_config=dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=8))
    with pytest.raises(UnsupportedArchitectureError, match="gemma4_text: config.enable_moe_block=True"):
        adapter_for(moe)  # 26B-A4B's block: a dense MLP beside the experts, not modelled
    llava_over_opt = T.LlavaConfig(text_config=dict(model_type="opt"))
    with pytest.raises(UnsupportedArchitectureError, match="language model is 'opt'"):
        adapter_for(llava_over_opt)
