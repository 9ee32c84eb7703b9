"""LoRA donors on a hybrid's recurrent mixers: an unmerged peft adapter on the mixer's input and
output projections (LFM2 ``in_proj`` / ``out_proj``, Qwen3.5 ``in_proj_qkv`` / ``in_proj_z`` / ...
/ ``out_proj``, Nemotron-H ``in_proj``: peft refuses Mamba's ``out_proj`` and conv) grafts exactly as
its merged model in float64; an adapter on the depthwise conv is refused in one line as it loads
(only LoRA on projections grafts; the model's kernel would read the conv's weight past the adapter;
the engine's mixer forward refuses one too, ``engine/mixers/pieces.kernels``)."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tiny_models import make_lora_adapter, make_tiny, random_ids

import weightgraft as wg
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.errors import UnsupportedLora
from weightgraft.models.peft_donor import adapter_info

PROJECTIONS = {
    "lfm2": ["in_proj", "out_proj"],  # out_proj is the attention layer's o too
    "qwen3_5_text": ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"],
    "nemotron_h": ["in_proj"],
}
CONVS = {"lfm2": r".*\.conv\.conv", "qwen3_5_text": r".*\.conv1d"}


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = random_ids(2, 9)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("arch", sorted(PROJECTIONS))
@torch.no_grad()
def test_lora_on_mixer_projections_grafts_as_the_merged_model(arch, tmp_path):
    base = make_tiny(arch, seed=0).double()
    path, merged = make_lora_adapter(base, PROJECTIONS[arch], tmp_path / "lora")
    donor = wg.load_peft(base, path)
    touched = adapter_info(donor).slots_touched
    assert {"layers.0.mixer_x", "layers.0.mixer_b"} <= set(touched) or {"layers.0.mixer_q", "layers.0.mixer_out"} <= set(touched)
    ids, mask = _batch()
    n = len(wg.slots(base))
    gen = torch.Generator().manual_seed(0)
    real = mask.bool()
    with float64_exact([base, donor, merged]):
        plain = base(input_ids=ids, attention_mask=mask).logits
        for source in (torch.randint(0, 2, (*ids.shape, n), generator=gen), torch.ones(*ids.shape, n, dtype=torch.long)):
            fast = wg.graft_forward([base, donor], ids, source, attention_mask=mask)
            ref = per_token_forward([base, merged], ids, source, attention_mask=mask)
            assert (fast[real] - ref[real]).abs().max().item() <= 1e-10
            assert (fast[real] - plain[real]).abs().max().item() > 1e-2  # the adapter moved the logits
        fast = wg.graft_forward([donor, base], ids, source, attention_mask=mask)  # the LoRA donor as the base
        ref = per_token_forward([merged, base], ids, source, attention_mask=mask)
        assert (fast[real] - ref[real]).abs().max().item() <= 1e-10


@pytest.mark.parametrize("arch", sorted(CONVS))
@torch.no_grad()
def test_lora_on_a_mixer_conv_is_refused_in_one_line(arch, tmp_path):
    base = make_tiny(arch, seed=0).double()
    groups = next(m.groups for m in base.modules() if isinstance(m, torch.nn.Conv1d))
    # peft wraps a depthwise conv only at a rank divisible by its groups (and cannot merge it)
    pm = get_peft_model(copy.deepcopy(base), LoraConfig(r=groups, lora_alpha=groups, target_modules=CONVS[arch]))
    for name, p in pm.named_parameters():
        if "lora_B" in name:
            p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    pm.save_pretrained(tmp_path / "conv")
    with pytest.raises(UnsupportedLora, match=r"\.(conv\.conv|conv1d) is a peft Conv1d around a Conv1d") as err:
        wg.load_peft(base, tmp_path / "conv")  # refused as it loads, before any graft reads the kernel
    assert "merge the adapter" in str(err.value) and "\n" not in str(err.value)
