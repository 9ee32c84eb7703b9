"""Hybrids' recurrent token mixers against the per-token definition: at position p every weight
the mixer applies at step p (projections, conv kernel, decay parameters, gated norm) is p's
model's, and the conv and recurrent states carry earlier positions as their own models computed
them. On tiny random LFM2 (short convolutions) and Qwen3.5 (Gated DeltaNet) models with mixer and
attention layers: random maps over 3 models, one component at one position, padding on either
side, rows alone and in a batch, continuing from a cache, and what is refused."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from tiny_models import HYBRID_CONFIGS, _randomize, make_donor, make_tiny, padded_ids, random_ids, tiny_tokenizer
from transformers import DynamicCache

import weightgraft as wg
from weightgraft.engine.architectures import (
    MIXER_COMPONENTS,
    UnsupportedArchitectureError,
    adapter_for,
    model_slots,
    part_state,
)
from weightgraft.engine.check import check_engine
from weightgraft.engine.forward import graft_call, position_ids_from_mask
from weightgraft.engine.mixers import mamba2
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentTypeError
from weightgraft.models.lean import donor_view, memory_report, needed_parameters
from weightgraft.schemes.selectors import select_components

HYBRIDS = sorted(HYBRID_CONFIGS)
TOL32 = 1e-4


def _models(model_type: str, dtype: torch.dtype) -> list[torch.nn.Module]:
    base = make_tiny(model_type, seed=0).to(dtype)
    return [base, make_donor(base, 1), make_donor(base, 2)]



def _diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    real = mask.bool()
    return (a[real] - b[real]).abs().max().item()


def _random_map(shape: tuple[int, int], n_slots: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 3, (*shape, n_slots), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_float64_random_maps_equal_the_definition(model_type):
    models = _models(model_type, torch.float64)
    n = len(wg.slots(models[0]))
    with float64_exact(models):
        for side in ("left", "right"):
            ids, mask = padded_ids(side=side)
            source = _random_map(tuple(ids.shape), n, seed=3)
            fast = wg.graft_forward(models, ids, source, attention_mask=mask)
            ref = per_token_forward(models, ids, source, attention_mask=mask)
            assert _diff(fast, ref, mask) <= 1e-10
            plain = models[0](input_ids=ids, attention_mask=mask).logits
            assert _diff(ref, plain, mask) > 1e-1  # the graft moved the logits
            for b in range(ids.shape[0]):  # each row alone equals the row in the batch
                span = mask[b].bool()
                alone = wg.graft_forward(models, ids[b:b + 1, span], source[b:b + 1, span])
                assert (alone[0] - fast[b, span]).abs().max().item() <= 1e-10


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_float32_random_maps_equal_the_definition(model_type):
    models = _models(model_type, torch.float32)
    ids, mask = padded_ids()
    source = _random_map(tuple(ids.shape), len(wg.slots(models[0])), seed=5)
    fast = wg.graft_forward(models, ids, source, attention_mask=mask)
    ref = per_token_forward(models, ids, source, attention_mask=mask)
    scale = ref[mask.bool()].abs().max().item()
    assert _diff(fast, ref, mask) <= TOL32 * max(1.0, scale)


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_a_uniform_map_reproduces_each_model_bit_for_bit(model_type):
    models = _models(model_type, torch.float32)
    ids = random_ids(2, 7)
    shape = (2, 7, len(wg.slots(models[0])))
    for m, model in enumerate(models):
        assert torch.equal(wg.graft_forward(models, ids, torch.full(shape, m)), model(input_ids=ids).logits)


def _one_cell(models, ids: torch.Tensor, name: str, position: int) -> torch.Tensor:
    names = wg.slots(models[0])
    source = torch.zeros(*ids.shape, len(names), dtype=torch.long)
    source[:, position, names.index(name)] = 1
    return source


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_one_component_at_one_position_equals_the_definition(model_type):
    """Each mixer component of the first mixer layer (and Qwen3.5's attention gate) grafted alone
    at one position of a left-padded batch: the kernel's effect reaches the next positions, the
    decay's every later one."""
    models = _models(model_type, torch.float64)
    ids, mask = padded_ids(lengths=(9, 7))
    mixer_slots = [s.name for s in model_slots(models[0]) if s.mixer is not None and s.name.startswith("layers.0.")]
    gates = [n for n in wg.slots(models[0]) if n.endswith(".attn_gate")]
    assert mixer_slots
    with float64_exact(models):
        base_logits = models[0](input_ids=ids, attention_mask=mask).logits * mask[..., None]
        for name in mixer_slots + gates:
            source = _one_cell(models, ids, name, position=5)
            fast = wg.graft_forward(models, ids, source, attention_mask=mask) * mask[..., None]
            ref = per_token_forward(models, ids, source, attention_mask=mask)
            assert _diff(fast, ref, mask) <= 1e-10, name
            moved = (fast[:, 5:] - base_logits[:, 5:]).abs().amax(dim=(0, 2))
            assert moved[0].item() > 1e-3, name  # at the grafted position
            assert (fast[:, :5] - base_logits[:, :5]).abs().max().item() <= 1e-10, name  # not before it
            if name.endswith(("mixer_conv", "mixer_decay")):
                assert moved[1].item() > 1e-3, name  # and after it: the kernel / the state carries it


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_continuing_from_a_cache_equals_one_pass(model_type):
    """A pass's conv and recurrent states continued by a later call (generation, prefix
    continuation), each call with its own map, equal the whole map in one pass."""
    models = _models(model_type, torch.float64)
    ids, mask = padded_ids(side="right", lengths=(9, 9))
    source = _random_map(tuple(ids.shape), len(wg.slots(models[0])), seed=7)
    with float64_exact(models):
        whole = wg.graft_forward(models, ids, source)
        cache = DynamicCache(config=models[0].config)
        first = graft_call(models, ids[:, :4], SourceMap(source[:, :4]), past_key_values=cache, use_cache=True).logits
        parts = [first]
        for t in range(4, ids.shape[1]):  # one token at a time, as generation runs
            parts.append(graft_call(models, ids[:, t:t + 1], SourceMap(source[:, t:t + 1]), past_key_values=cache,
                                    attention_mask=torch.ones(2, t + 1, dtype=torch.long), use_cache=True).logits)
    assert (torch.cat(parts, dim=1) - whole).abs().max().item() <= 1e-10


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_slots_groups_and_refusals(model_type):
    base = make_tiny(model_type)
    slots = model_slots(base)
    if model_type == "falcon_h1":  # attention and the mixer side by side in every layer
        for i in range(base.config.num_hidden_layers):
            names = {s.name.split(".", 2)[2] for s in slots if s.name.startswith(f"layers.{i}.")}
            assert {"q", "k", "v", "o", "mixer_conv", "mixer_out", "attn_norm", "mlp_norm"} <= names
    for i, kind in enumerate(base.config.layer_types if model_type != "falcon_h1" else ()):
        names = {s.name.split(".", 2)[2] for s in slots if s.name.startswith(f"layers.{i}.")}  # a mixer layer: no attention
        mixer = kind not in ("full_attention", "mlp")  # Nemotron-H's MLP blocks hold neither
        assert {"mixer_conv", "mixer_out"} <= names if mixer else not any(n.startswith("mixer_") for n in names)
        attention = {"q", "k", "v", "o"}
        assert not attention & names if kind != "full_attention" else attention <= names
        if model_type == "olmo_hybrid":  # pre-norm mixer layers, post-norm attention layers
            post_norm = kind == "full_attention"
            assert ({"post_attn_norm", "post_mlp_norm"} <= names) == post_norm
            assert bool({"attn_norm", "mlp_norm"} & names) != post_norm
        else:
            assert ("mlp_norm" in names) == (model_type != "nemotron_h" or kind == "mlp")  # one norm a block there
    available = {s.name.split(".", 2)[2] for s in slots if s.name.startswith("layers.")}
    assert "mixer_conv" in select_components("mixer", available)
    assert select_components("mixer-mixer_conv", available) == select_components("mixer", available) - {"mixer_conv"}
    assert select_components("layer", available) >= select_components("mixer", available)
    with pytest.raises(GraftArgumentTypeError, match="recurrent token mixer"):
        PartialGraft(base, make_donor(base, 1))


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_a_lean_donor_of_the_decay_holds_only_its_tensors(model_type):
    base = make_tiny(model_type, seed=0).double()
    donor = make_donor(base, 1)
    slot = next(s for s in model_slots(base) if s.name.endswith("mixer_decay") or s.name.endswith("mixer_conv"))
    needed = needed_parameters(base, [slot.name])
    part = slot.parts[0]
    assert needed == {f"{part.path}.{n}" for n, _ in part_state(base, part)}  # A_log / dt_bias; a kernel (and bias)
    params = dict(donor.named_parameters())
    view = donor_view(base, {n: params[n] for n in needed})
    assert memory_report(view, base).tensors_held == len(needed)
    ids, mask = padded_ids()
    source = _one_cell([base], ids, slot.name, position=3)
    assert torch.equal(wg.graft_forward([base, view], ids, source, attention_mask=mask),
                       wg.graft_forward([base, donor], ids, source, attention_mask=mask))


def _built(model_type: str, **options: object) -> torch.nn.Module:
    """A tiny ``model_type`` in float64 with its config's ``options`` changed, randomized as make_tiny's."""
    config = copy.deepcopy(HYBRID_CONFIGS[model_type])
    for name, value in options.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    base = T.AutoModelForCausalLM.from_config(config).double().eval()
    _randomize(base, torch.Generator().manual_seed(0))
    return base


@pytest.mark.parametrize(("model_type", "option"), [("lfm2", "conv_bias"), ("nemotron_h", "use_bias")])
@torch.no_grad()
def test_a_biased_conv_input_at_padded_positions_is_not_read(model_type, option):
    """LFM2 / Nemotron-H with biases: a pad's conv input is the in_proj bias, not zero, in
    transformers' own padded forward; the engine zeroes it, so even the base alone under padding
    equals its rows run alone (the definition)."""
    base = _built(model_type, **{option: True})
    models = [base, make_donor(base, 1)]
    ids, mask = padded_ids()
    n = len(wg.slots(base))
    with float64_exact(models):
        base_alone = torch.zeros(*ids.shape, n, dtype=torch.long)
        for source in (base_alone, _random_map(tuple(ids.shape), n, seed=9) % 2):
            ref = per_token_forward(models, ids, source, attention_mask=mask)
            assert _diff(wg.graft_forward(models, ids, source, attention_mask=mask), ref, mask) <= 1e-10
        leaky = base(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        rows_alone = per_token_forward(models, ids, base_alone, attention_mask=mask)
        assert _diff(leaky, rows_alone, mask) > 1e-3  # transformers' own padded forward reads the bias


@torch.no_grad()
def test_qwen3_5_query_heads_interleaved_with_the_gate_graft_head_by_head():
    models = _models("qwen3_5_text", torch.float64)
    ids, mask = padded_ids()
    names = wg.slots(models[0])
    source = torch.zeros(*ids.shape, len(names), dtype=torch.long)
    heads = {"layers.1.q": torch.randint(0, 3, (*ids.shape, 4), generator=torch.Generator().manual_seed(2))}
    with float64_exact(models):
        fast = wg.graft_forward(models, ids, source, attention_mask=mask, head_source=heads)
        ref = per_token_forward(models, ids, SourceMap(source, heads), attention_mask=mask)
        plain = models[0](input_ids=ids, attention_mask=mask).logits
    assert _diff(fast, ref, mask) <= 1e-10
    assert _diff(fast, plain, mask) > 1e-2


@pytest.mark.parametrize("model_type", HYBRIDS)
@torch.no_grad()
def test_weightgraft_check_passes_with_prefix_and_depth_sharing_running_rows_whole(model_type):
    """``weightgraft check``'s cases, the runner's prefix sharing and the cells' depth sharing
    included: a hybrid's cache holds recurrent layers, which are not shared, so its rows run whole
    (said in a warning), and every case is at float64 rounding."""
    models = _models(model_type, torch.float64)[:2]
    ids, mask = padded_ids(lengths=(8, 5))
    with pytest.warns(UserWarning, match="prefix sharing is not supported"):
        report = check_engine(models, ids, mask)
    assert report.passed and report.max_abs_diff <= 1e-10


@torch.no_grad()
def test_rules_name_mixer_components_and_the_mixer_group():
    tok = tiny_tokenizer()
    pre = make_tiny("qwen3_5_text", vocab_size=len(tok))
    models = {"pre": pre, "sft": make_donor(pre, 1)}
    prompts = ["The capital of France is", "Paris is in"]
    conv = wg.graft(models, tok, prompts, wg.Rule(model="sft", positions="last", components="mixer_conv"))
    mixer = wg.graft(models, tok, prompts, wg.Rule(model="sft", positions="last", components="mixer"))
    plain = wg.graft(models, tok, prompts, [])
    names = wg.slots(pre)
    enc = tok(prompts, padding=True, return_tensors="pt")
    last = enc["input_ids"].shape[1] - 1 - enc["attention_mask"].flip(1).argmax(1)
    for got, chosen in ((conv, {"mixer_conv"}), (mixer, set(MIXER_COMPONENTS))):
        source = torch.zeros(*enc["input_ids"].shape, len(names), dtype=torch.long)
        cols = [i for i, n in enumerate(names) if n.startswith("layers.") and n.split(".", 2)[2] in chosen]
        source[torch.arange(2)[:, None], last[:, None], torch.tensor(cols)] = 1
        logits = wg.graft_forward([pre, models["sft"]], enc["input_ids"], source, attention_mask=enc["attention_mask"])
        torch.testing.assert_close(got.logits, logits[torch.arange(2), last])
        assert (got.logits - plain.logits).abs().max().item() > 1e-3


@torch.no_grad()
def test_mamba2_step_floor_follows_the_batched_scan():
    """transformers' Mamba2 floors the step dt at ``time_step_min`` in its batched (prefill) scan but not
    in its one-token decode step, so its own token-by-token run is another function of the weights. The
    definition follows the batched scan: the per-token reference floors its decode steps too and equals
    the model's own batched forward; the engine equals the reference, from a continued cache too."""
    base = _built("nemotron_h", time_step_min=0.7)  # the floor binds at about half the steps
    models = [base, make_donor(base, 1), make_donor(base, 2)]
    ids = random_ids(2, 9)
    n = len(wg.slots(base))
    step = mamba2.nemotron_h.mamba2_selective_state_update
    with float64_exact(models):
        batched = base(input_ids=ids).logits
        cache = DynamicCache(config=base.config)
        decoded = torch.cat([base(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                             for t in range(ids.shape[1])], dim=1)
        assert (decoded - batched).abs().max().item() > 1e-3  # transformers' two paths disagree
        uniform = torch.zeros(*ids.shape, n, dtype=torch.long)
        assert (per_token_forward(models, ids, uniform) - batched).abs().max().item() <= 1e-10
        source = _random_map(tuple(ids.shape), n, seed=11)
        fast = wg.graft_forward(models, ids, source)
        assert (fast - per_token_forward(models, ids, source)).abs().max().item() <= 1e-10
        for chosen in (source, uniform):  # a graft, and one model alone, continued token by token
            cache = DynamicCache(config=base.config)
            parts = [graft_call(models, ids[:, :4], SourceMap(chosen[:, :4]), past_key_values=cache,
                                use_cache=True).logits]
            for t in range(4, ids.shape[1]):
                parts.append(graft_call(models, ids[:, t:t + 1], SourceMap(chosen[:, t:t + 1]), past_key_values=cache,
                                        attention_mask=torch.ones(2, t + 1, dtype=torch.long), use_cache=True).logits)
            whole = fast if chosen is source else batched
            assert (torch.cat(parts, dim=1) - whole).abs().max().item() <= 1e-10
    assert mamba2.nemotron_h.mamba2_selective_state_update is step  # the reference's floor is undone


def test_families_not_grafted_are_refused_in_one_line_from_their_config():
    moe = copy.deepcopy(HYBRID_CONFIGS["nemotron_h"])
    moe.layers_block_type = ["linear_attention", "moe"]
    refusals = {"kimi_linear": "low-rank"}
    for config, words in [(moe, "'moe' blocks"), *((T.AutoConfig.for_model(m), w) for m, w in refusals.items())]:
        with pytest.raises(UnsupportedArchitectureError, match=words) as caught:
            adapter_for(config)
        assert "\n" not in str(caught.value)


@torch.no_grad()
def test_falcon_h1_without_the_mixers_norm_gates_by_silu_and_a_step_floor_is_refused():
    """Falcon-H1's default: no gated norm in the mixer (``mamba_rms_norm`` False, the output gated by
    ``silu(z)``): equal to the definition on a random map; a config whose scan floors the step (its
    decode step would not) is refused from the config."""
    config = copy.deepcopy(HYBRID_CONFIGS["falcon_h1"])
    config.mamba_rms_norm = False
    base = _randomized(T.FalconH1ForCausalLM(config)).double()
    models = [base, make_donor(base, 1), make_donor(base, 2)]
    assert not any(n.endswith("mixer_norm") for n in wg.slots(base))
    ids, mask = padded_ids()
    source = _random_map(tuple(ids.shape), len(wg.slots(base)), seed=7)
    with float64_exact(models):
        fast = wg.graft_forward(models, ids, source, attention_mask=mask)
        ref = per_token_forward(models, ids, source, attention_mask=mask)
    assert _diff(fast, ref, mask) <= 1e-10
    assert _diff(ref, base(input_ids=ids, attention_mask=mask).logits, mask) > 1e-1
    floored = copy.deepcopy(config)
    floored.time_step_limit = (0.001, float("inf"))
    with pytest.raises(UnsupportedArchitectureError, match="time_step_limit"):
        adapter_for(floored)


def _randomized(model: torch.nn.Module) -> torch.nn.Module:
    _randomize(model, torch.Generator().manual_seed(0))
    return model.eval()
