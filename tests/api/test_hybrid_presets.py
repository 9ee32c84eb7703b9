"""The paper's presets on hybrids (LFM2, Qwen3.5, Nemotron-H): ``wg.explain`` says which layers are
attention and which recurrent mixers, and every scheme of the position and component presets runs
through ``wg.graft`` and equals the per-token reference in float64 (a rule naming ``o`` or ``attn``
over layers that are mixers grafts nothing there, and is no error)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import HYBRID_CONFIGS, MOE_CONFIGS, make_donor, make_tiny

import weightgraft as wg
from weightgraft.api.explain import layer_kinds
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward

HYBRIDS = sorted(HYBRID_CONFIGS)
PROMPTS = ["Tom is in", "Ann was at"]
SPANS = [{"first_entity": "Tom"}, {"first_entity": "Ann"}]
# 4 layers, so that each quarter is one layer; Nemotron-H's own 4 blocks (its kinds are not a repeating pattern)
KINDS = {
    "lfm2": ["mixer (short_conv)", "attention", "mixer (short_conv)", "mixer (short_conv)"],
    "qwen3_5_text": ["mixer (gated_delta_net)", "attention", "mixer (gated_delta_net)", "mixer (gated_delta_net)"],
    "nemotron_h": ["mixer (mamba2)", "attention", "mlp", "mixer (mamba2)"],
    "falcon_h1": ["attention + mixer (falcon_mamba2)"] * 4,  # side by side in every layer
    "olmo_hybrid": ["mixer (olmo_gated_delta_net)", "attention", "mixer (olmo_gated_delta_net)", "mixer (olmo_gated_delta_net)"],
}
KINDS |= {"lfm2_moe": KINDS["lfm2"], "qwen3_5_moe_text": KINDS["qwen3_5_text"],
          "qwen3_next": [k.replace("gated_delta_net", "next_gated_delta_net") for k in KINDS["qwen3_5_text"]]}  # mixtures of experts in every layer's MLP


def _pair(arch: str, tok) -> tuple[torch.nn.Module, torch.nn.Module]:
    base = make_tiny(arch, seed=0, vocab_size=len(tok), n_layers=None if arch == "nemotron_h" else 4).double()
    return base, make_donor(base, seed=1)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_explain_names_attention_and_mixer_layers(arch, tiny_tok):
    base, _ = _pair(arch, tiny_tok)
    assert layer_kinds(base) == dict(enumerate(KINDS[arch]))
    table = wg.explain([wg.Rule(model="sft", positions="last", layers="last_quarter", components="o"),
                        wg.Rule(model="sft", components="attn+o+ffn")], base)
    o_late, every = table.iloc[0], table.iloc[1]
    assert o_late.layer_kinds == {3: KINDS[arch][3]}
    if KINDS[arch][3].startswith("attention"):  # Falcon-H1: attention beside the mixer, so layer 3 has an o
        assert o_late.layers == [3] and o_late.slots == ["layers.3.o"]
    else:
        assert o_late.layers == [] and o_late.slots == []  # a mixer: no o
    assert every.layer_kinds == dict(enumerate(KINDS[arch]))
    attention = [i for i, k in enumerate(KINDS[arch]) if k.startswith("attention")]
    assert sorted({int(s.split(".")[1]) for s in every.slots if s.endswith(".o")}) == attention


@pytest.mark.parametrize("arch", HYBRIDS)
@torch.no_grad()
def test_position_and_component_presets_equal_the_per_token_reference(arch, tiny_tok):
    base, donor = _pair(arch, tiny_tok)
    models = {"pre": base, "sft": donor}
    schemes = [*wg.presets.preset("position"), *wg.presets.preset("component")]
    references: dict[bytes, torch.Tensor] = {}  # schemes with one map (layers with nothing to graft) share it
    moved = 0
    with float64_exact([base, donor]):
        plain = None
        for scheme in schemes:
            try:
                out = wg.graft(models, tiny_tok, PROMPTS, scheme, spans=SPANS)
            except wg.GraftInputError as exc:  # up / down where every MLP is a mixture of experts: refused
                assert arch in MOE_CONFIGS and "has no component" in str(exc), scheme.name
                continue
            key = out.source.numpy().tobytes()
            if key not in references:
                ref = per_token_forward([base, donor], out.input_ids, out.source, attention_mask=out.attention_mask)
                last = out.attention_mask.sum(1) - 1
                references[key] = ref[torch.arange(len(PROMPTS)), last]
            assert (out.logits - references[key]).abs().max().item() <= 1e-10, scheme.name
            if scheme.name == "PRE":
                plain = out.logits
            elif plain is not None:
                moved += int((out.logits - plain).abs().max().item() > 1e-3)
    assert moved >= len(schemes) // 2  # most schemes move the logits: the check is not of empty grafts
