"""Models placed with a device_map (accelerate hooks on their modules) graft exactly and keep
their hooks. Runs on CPU: it checks the hook handling, not the multi-GPU placement itself."""

from __future__ import annotations

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module

import weightgraft as wg
from weightgraft.models import ModelLoadError, load_model
from weightgraft.engine.reference import per_token_forward
from tiny_models import make_donor, make_tiny


def _hook_layers(model):
    """What dispatch_model does to a model placed over devices: a device hook per block,
    and here also on leaf projections that the engine patches."""
    hooked = []
    for name, module in model.named_modules():
        if name.endswith(("layers.0", "layers.1", "self_attn.o_proj", "mlp.down_proj")):
            add_hook_to_module(module, AlignDevicesHook(execution_device="cpu", io_same_device=True))
            hooked.append(module)
    return hooked


@torch.no_grad()
def test_hooked_models_graft_exactly_and_keep_their_hooks():
    base = make_tiny("llama", seed=0)
    donor = make_donor(base, 1)
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    source = torch.randint(0, 2, (2, 7, len(wg.slots(base))), generator=gen)
    expected = per_token_forward([base, donor], ids, source)
    hooked = _hook_layers(base) + _hook_layers(donor)
    forwards = [m.__dict__["forward"] for m in hooked]
    got = wg.graft_forward([base, donor], ids, source, logit_positions=torch.tensor([[6], [5]]))
    assert (got[0, 0] - expected[0, 6]).abs().max() <= 1e-4
    assert (got[1, 0] - expected[1, 5]).abs().max() <= 1e-4
    assert [m.__dict__["forward"] for m in hooked] == forwards  # hooks restored, not dropped


def test_device_map_load_and_refusals(tmp_path):
    base = make_tiny("llama", seed=0)
    base.save_pretrained(tmp_path / "m")
    from tiny_models import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "m")
    placed = load_model(tmp_path / "m", device_map={"": "cpu"})
    assert wg.models.weights_sha256(placed.model) == wg.models.weights_sha256(base)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="device_map is not available for GGUF"):
        load_model(gguf, device_map="auto")
