"""Models placed with a device_map (accelerate hooks on their modules) graft exactly and keep
their hooks. Runs on CPU: it checks the hook handling, not the multi-GPU placement itself."""

from __future__ import annotations

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from tiny_models import make_donor, make_tiny

import weightgraft as wg
from weightgraft.engine.reference import per_token_forward
from weightgraft.models import ModelLoadError, load_model


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


def test_device_map_load_and_refusals(tmp_path, tiny_model_dirs, tiny_pair):
    placed = load_model(tiny_model_dirs["pre"], device_map={"": "cpu"})
    assert wg.models.weights_sha256(placed.model) == wg.models.weights_sha256(tiny_pair("llama", torch.float32)[0])
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="device_map is not available for GGUF"):
        load_model(gguf, device_map="auto")


_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
_BLOCKS = ("model.embed_tokens", "model.rotary_emb", "model.layers.0", "model.layers.1", "model.norm", "lm_head")


def _lora_batch(base):
    ids = torch.randint(3, 64, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    gen = torch.Generator().manual_seed(1)
    shape = (*ids.shape, len(wg.slots(base)))
    rows = torch.randint(0, 2, ids.shape, generator=gen)[..., None].expand(shape).clone()
    return ids, mask, [torch.randint(0, 2, shape, generator=gen), rows]


@torch.no_grad()
def test_lora_donor_on_a_dispatched_base_grafts_exactly_with_adapters_on_their_devices(tmp_path):
    """accelerate's dispatch_model (every block "cpu", hooks forced, as a multi-GPU map attaches
    them): the LoRA donor built on it equals the per-token definition on the merged model."""
    from accelerate import dispatch_model
    from tiny_models import make_lora_adapter

    from weightgraft.engine import lora
    from weightgraft.engine.precision import float64_exact

    base = make_tiny("llama", seed=0).double()
    path, merged = make_lora_adapter(base, _LORA_TARGETS, tmp_path / "lora")
    ids, mask, sources = _lora_batch(base)
    with float64_exact([base, merged]):  # the definition, before any placement
        expected = [per_token_forward(ms, ids, s, attention_mask=mask) for s in sources for ms in
                    ([base, merged], [merged, base])]
    dispatch_model(base, {name: "cpu" for name in _BLOCKS}, main_device="cpu", force_hooks=True)
    assert hasattr(base.model.layers[1].self_attn.o_proj, "_hf_hook") and base.hf_device_map
    hooked = [m for m in base.modules() if hasattr(m, "_hf_hook")]
    forwards = [m.__dict__["forward"] for m in hooked]
    donor = wg.load_peft(base, path)
    wrapped = [m for m in donor.modules() if lora.is_lora(m)]
    assert len(wrapped) == 15 and not lora.has_lora(base)
    for m in wrapped:  # each adapter on its projection's device, its input moved there by a hook
        device = lora.base_layer(m).weight.device
        assert {p.device for n, p in m.named_parameters() if "lora_" in n} == {device}
        assert m._hf_hook.execution_device == device
    assert "to" in base.__dict__ and "to" not in donor.__dict__  # dispatch_model's .to is the base's
    worst = 0.0
    with float64_exact([base, donor]):
        for i, s in enumerate(sources):
            for j, ms in enumerate(([base, donor], [donor, base])):
                got = wg.graft_forward(ms, ids, s, attention_mask=mask)
                worst = max(worst, (got - expected[2 * i + j])[mask.bool()].abs().max().item())
    print(f"LoRA donor on a dispatched base: worst |graft_forward - per-token| = {worst:.3g}")
    assert worst <= 1e-10
    assert [m.__dict__["forward"] for m in hooked] == forwards  # the base's hooks in place


def test_a_lora_donor_refuses_a_base_offloaded_by_its_device_map(tmp_path):
    from accelerate import dispatch_model
    from tiny_models import make_lora_adapter

    from weightgraft.models.peft_donor import PeftError

    base = make_tiny("llama", seed=0)
    path, _ = make_lora_adapter(base, ["q_proj"], tmp_path / "lora")
    placement = {name: "disk" if name == "model.layers.1" else "cpu" for name in _BLOCKS}
    dispatch_model(base, placement, main_device="cpu", offload_dir=str(tmp_path / "off"))
    with pytest.raises(PeftError, match=r"model\.layers\.1\..* is offloaded by its device_map"):
        wg.load_peft(base, path)
