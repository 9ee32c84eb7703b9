"""gpt-oss's attention sinks against the per-token definition: the sinks that query position p uses
are p's model's (as its q is); keys and values never see them. Grafted alone at one position, on
either padding side, through a cached prefix, from a lean donor, by a rule, and through an attention
implementation that reads them from ``s_aux`` (as flash attention does); the rest of gpt-oss (router,
bank) is in test_moe.py's matrix."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from test_moe import _models
from tiny_models import last_token_reference, make_donor, make_tiny, padded_ids, random_ids

import weightgraft as wg
from weightgraft.engine.forward import graft_call
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap


def _sinks_only(base: torch.nn.Module, shape: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
    """Model 1 serves every layer's attention sinks at ``positions`` ``[batch]``, model 0 the rest."""
    names = wg.slots(base)
    source = torch.zeros(*shape, len(names), dtype=torch.long)
    sinks = [i for i, n in enumerate(names) if n.endswith(".sinks")]
    source[torch.arange(shape[0])[:, None], positions[:, None], torch.tensor(sinks)[None, :]] = 1
    return source


@pytest.mark.parametrize("side", ["left", "right"])
@torch.no_grad()
def test_grafting_only_the_sinks_at_one_position_equals_the_definition(side):
    """gpt-oss's sinks at query position p are p's model's: grafted at one position they move that
    position and later ones (through later layers' keys and values), and leave earlier ones bit for bit."""
    models = _models("gpt_oss", torch.float64)[:2]
    ids, mask = padded_ids(side=side)
    first = mask.argmax(1)
    picked = first + 3  # the fourth real token of each row
    source = _sinks_only(models[0], tuple(ids.shape), picked)
    with float64_exact(models):
        fast = wg.graft_forward(models, ids, source, attention_mask=mask)
        ref = per_token_forward(models, ids, source, attention_mask=mask)
        plain = wg.graft_forward(models, ids, torch.zeros_like(source), attention_mask=mask)  # PRE alone
    real = mask.bool()
    assert (fast[real] - ref[real]).abs().max().item() <= 1e-10
    for b in range(ids.shape[0]):
        assert torch.equal(fast[b, first[b]:picked[b]], plain[b, first[b]:picked[b]])  # before p: untouched
        assert (fast[b, picked[b]] - plain[b, picked[b]]).abs().max().item() > 1e-3  # p moves


@torch.no_grad()
def test_a_donor_differing_only_in_its_sinks_is_grafted_as_itself_through_the_cache():
    """Sinks grafted everywhere give the donor bit for bit; a pass continued from a cached prefix
    (the cache is updated once per layer, before the attention function the graft wraps) equals
    the whole pass."""
    base = make_tiny("gpt_oss", seed=0).double()
    donor = copy.deepcopy(base)
    for name, p in donor.named_parameters():
        if name.endswith(".sinks"):
            p.copy_(torch.linspace(-3.0, 3.0, p.numel()))
    ids = random_ids(2, 9)
    names = wg.slots(base)
    sinks = torch.tensor([n.endswith(".sinks") for n in names])
    source = (torch.rand(*ids.shape, generator=torch.Generator().manual_seed(2)) < 0.5)[..., None] & sinks
    source = source.long()
    with float64_exact([base, donor]):
        everywhere = wg.graft_forward([base, donor], ids, sinks.long().expand(*ids.shape, -1))
        assert torch.equal(everywhere, donor(input_ids=ids).logits)
        assert (everywhere - base(input_ids=ids).logits).abs().max().item() > 1e-2
        whole = wg.graft_forward([base, donor], ids, source)
        cache = T.DynamicCache(config=base.config)
        graft_call([base, donor], ids[:, :5], SourceMap(source[:, :5]), past_key_values=cache, use_cache=True)
        rest = graft_call([base, donor], ids[:, 5:], SourceMap(source[:, 5:]), past_key_values=cache,
                             attention_mask=torch.ones_like(ids)).logits
        ref = per_token_forward([base, donor], ids, source)
    assert (whole - ref).abs().max().item() <= 1e-10
    assert (rest - whole[:, 5:]).abs().max().item() <= 1e-10


def _attention_by_s_aux(module, query, key, value, attention_mask, s_aux=None, **kwargs):
    """gpt-oss's eager attention reading the sinks from ``s_aux`` (as flash attention does) and its
    own name from the module's config (as flash attention reads it)."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    assert module.config._attn_implementation == "s_aux_eager"
    view = SimpleNamespace(num_key_value_groups=module.num_key_value_groups, sinks=s_aux, training=module.training)
    return eager_attention_forward(view, query, key, value, attention_mask, **kwargs)


@torch.no_grad()
def test_sinks_reach_another_attention_implementation_through_s_aux_and_every_config_comes_back():
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    T.AttentionInterface.register("s_aux_eager", _attention_by_s_aux)
    AttentionMaskInterface.register("s_aux_eager", eager_mask)
    models = _models("gpt_oss", torch.float64)
    ids, mask = padded_ids()
    source = torch.randint(0, 3, (*ids.shape, len(wg.slots(models[0]))), generator=torch.Generator().manual_seed(7))
    real = mask.bool()
    with float64_exact(models):
        eager = wg.graft_forward(models, ids, source, attention_mask=mask)
        for m in models:
            m.config._attn_implementation = "s_aux_eager"
        other = wg.graft_forward(models, ids, source, attention_mask=mask)
        ref = per_token_forward(models, ids, source, attention_mask=mask)
    assert (other[real] - ref[real]).abs().max().item() <= 1e-10
    assert (other[real] - eager[real]).abs().max().item() <= 1e-10
    half = [m.to(torch.bfloat16) for m in models]  # the pass runs eager in half precision, then gives it back
    wg.graft_forward(half, ids, source, attention_mask=mask)
    for m in half:
        attention = [mod for mod in m.modules() if hasattr(mod, "sinks")]
        assert m.config._attn_implementation == "s_aux_eager"
        assert all(mod.config is m.config for mod in attention)


@pytest.mark.parametrize("components", ["sinks", "attn"])
def test_a_rule_names_the_sinks_alone_or_in_the_attention_group(tiny_pair, tiny_tok, components):
    pre, sft = tiny_pair("gpt_oss")
    prompts = ["Paris is in", "The cat sat"]
    with float64_exact([pre, sft]):
        out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts,
                       wg.Rule(model="sft", positions="last", components=components))
    ends = {"sinks": (".sinks",), "attn": (".q", ".k", ".v", ".sinks")}[components]
    last = last_token_reference(pre, sft, tiny_tok, prompts, lambda n: n.endswith(ends))
    assert (out.logits - last).abs().max().item() <= 1e-10
    plain = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts, wg.Rule(model="pre"))
    assert (out.logits - plain.logits).abs().max().item() > 1e-3


@torch.no_grad()
def test_a_lean_donor_holding_only_the_sinks_equals_the_full_donor_bit_for_bit(tmp_path):
    from weightgraft.models.hashing import weights_sha256
    from weightgraft.models.lean import lean_from_safetensors, memory_report, needed_parameters

    base = make_tiny("gpt_oss", seed=0)
    donor = make_donor(base, 1)
    donor.save_pretrained(tmp_path / "donor")
    served = [n for n in wg.slots(base) if n.endswith(".sinks")]
    needed = needed_parameters(base, served)
    assert needed == {f"model.layers.{i}.self_attn.sinks" for i in range(len(served))}  # the sinks, not the attention
    lean, digest = lean_from_safetensors(base, tmp_path / "donor", needed)
    assert digest == weights_sha256(donor) and memory_report(lean, base).tensors_held == len(needed)
    ids = random_ids(2, 7)
    source = _sinks_only(base, tuple(ids.shape), torch.tensor([6, 6]))
    got = wg.graft_forward([base, lean], ids, source)
    assert torch.equal(got, wg.graft_forward([base, donor], ids, source))
    assert (got - base(input_ids=ids).logits).abs().max().item() > 1e-3
