"""Mixtures of experts against the per-token definition: at position p the router (weights and
buffers) and every expert it picks use the weights of the model the source map names for p; an
expert the router does not pick contributes nothing. On tiny random configs of every admitted MoE
family: random maps over 3 models, router-only, experts-only, expert-by-expert and shared-only
grafts, left and right padding, rows alone and in a batch (gpt-oss's attention sinks: test_sinks.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from tiny_models import MOE_CONFIGS, last_token_reference, make_donor, make_tiny, padded_ids, random_ids

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.compat import ModelMismatchError, check_compatible
from weightgraft.engine.partial import PartialGraft
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError

MOE = sorted(MOE_CONFIGS)
SHARED = [m for m in MOE if any(n.endswith("shared_up") for n in wg.slots(make_tiny(m, randomize=False)))]
TOL32 = 1e-4
ROUTER_BUFFERS = ("e_score_correction_bias", "expert_bias")  # DeepSeek's routing correction, LFM2-MoE's block bias


def _models(model_type: str, dtype: torch.dtype, implementation: str = "eager") -> list[torch.nn.Module]:
    base = make_tiny(model_type, seed=0).to(dtype)
    base.set_experts_implementation(implementation)
    return [base, make_donor(base, 1), make_donor(base, 2)]



def _expert_maps(base: torch.nn.Module, shape: tuple[int, int], n_models: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.randint(0, n_models, (*shape, s.experts), generator=gen)
            for s in model_slots(base) if s.experts}


def _only(base: torch.nn.Module, shape: tuple[int, int], predicate) -> torch.Tensor:
    """A map that grafts model 1 into the slots ``predicate`` picks, everywhere."""
    names = wg.slots(base)
    source = torch.zeros(*shape, len(names), dtype=torch.long)
    source[..., [i for i, n in enumerate(names) if predicate(n)]] = 1
    return source


@pytest.mark.parametrize("model_type", MOE)
@torch.no_grad()
def test_float64_random_maps_and_experts_equal_the_definition(model_type):
    models = _models(model_type, torch.float64)
    for side in ("left", "right"):
        ids, mask = padded_ids(side=side)
        n = len(wg.slots(models[0]))
        source = torch.randint(0, 3, (*ids.shape, n), generator=torch.Generator().manual_seed(3))
        experts = _expert_maps(models[0], tuple(ids.shape), 3, seed=4)
        with float64_exact(models):
            for kw in ({}, {"expert_source": experts}):
                fast = wg.graft_forward(models, ids, source, attention_mask=mask, **kw)
                ref = per_token_forward(models, ids, SourceMap(source, experts=kw.get("expert_source", {})),
                                        attention_mask=mask)
                real = mask.bool()
                assert (fast[real] - ref[real]).abs().max().item() <= 1e-10
                plain = models[0](input_ids=ids, attention_mask=mask).logits
                assert (ref[real] - plain[real]).abs().max().item() > 1e-2  # the graft moved the logits
                for b in range(ids.shape[0]):  # each row alone equals the row in the batch
                    span = mask[b].bool()
                    alone = wg.graft_forward(models, ids[b:b + 1, span], source[b:b + 1, span],
                                             **{k: {s: m[b:b + 1, span] for s, m in v.items()} for k, v in kw.items()})
                    assert (alone[0] - fast[b, span]).abs().max().item() <= 1e-10


@pytest.mark.parametrize("model_type", MOE)
@torch.no_grad()
def test_float32_default_implementation_equals_the_definition(model_type):
    """transformers' default bank (grouped_mm) in the engine and in the reference alike."""
    models = _models(model_type, torch.float32, implementation="grouped_mm")
    ids, mask = padded_ids()
    n = len(wg.slots(models[0]))
    source = torch.randint(0, 3, (*ids.shape, n), generator=torch.Generator().manual_seed(5))
    experts = _expert_maps(models[0], tuple(ids.shape), 3, seed=6)
    fast = wg.graft_forward(models, ids, source, attention_mask=mask, expert_source=experts)
    ref = per_token_forward(models, ids, SourceMap(source, experts=experts), attention_mask=mask)
    real = mask.bool()
    scale = ref[real].abs().max().item()
    assert (fast[real] - ref[real]).abs().max().item() <= TOL32 * max(1.0, scale)


@pytest.mark.parametrize("model_type", MOE)
@torch.no_grad()
def test_router_only_experts_only_and_shared_only_grafts(model_type):
    models = _models(model_type, torch.float64)
    ids, mask = padded_ids()
    base_logits = models[0](input_ids=ids, attention_mask=mask).logits
    kinds = {"router": lambda n: n.endswith(".router"), "experts": lambda n: n.endswith(".experts"),
             "shared": lambda n: ".shared_" in n}
    real = mask.bool()
    with float64_exact(models):
        for kind, predicate in kinds.items():
            if kind == "shared" and model_type not in SHARED:
                continue
            source = _only(models[0], tuple(ids.shape), predicate)
            fast = wg.graft_forward(models, ids, source, attention_mask=mask)
            ref = per_token_forward(models, ids, source, attention_mask=mask)
            assert (fast[real] - ref[real]).abs().max().item() <= 1e-10, kind
            assert (fast[real] - base_logits[real]).abs().max().item() > 1e-2, kind


@pytest.mark.parametrize("model_type", MOE)
@torch.no_grad()
def test_a_uniform_map_reproduces_each_model_bit_for_bit(model_type):
    models = _models(model_type, torch.float32, implementation="grouped_mm")
    ids = random_ids(2, 7)
    shape = (2, 7, len(wg.slots(models[0])))
    for m, model in enumerate(models):
        assert torch.equal(wg.graft_forward(models, ids, torch.full(shape, m)), model(input_ids=ids).logits)


def _router_picks(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per expert bank, the experts its router picks at each position ``[batch * seq, k]``."""
    picks: dict[str, torch.Tensor] = {}
    hooks = []
    for slot in model_slots(model):
        if slot.experts:
            bank = model.get_submodule(slot.parts[0].path)
            hooks.append(bank.register_forward_pre_hook(
                lambda _m, args, name=slot.name: picks.__setitem__(name, args[1].clone())))
    model(input_ids=ids)
    for h in hooks:
        h.remove()
    return picks


@pytest.mark.parametrize("model_type", MOE)
@torch.no_grad()
def test_an_expert_the_router_never_picks_leaves_the_logits_bit_for_bit(model_type):
    models = _models(model_type, torch.float32)
    ids = random_ids(2, 7)
    picks = _router_picks(models[0], ids)
    experts = {}
    for slot in model_slots(models[0]):
        if slot.experts:
            picked = torch.zeros(ids.numel(), slot.experts, dtype=torch.bool).scatter_(1, picks[slot.name], True)
            experts[slot.name] = (~picked).long().view(*ids.shape, slot.experts)  # the donor serves every other one
    source = torch.zeros(*ids.shape, len(wg.slots(models[0])), dtype=torch.long)
    assert torch.equal(wg.graft_forward(models, ids, source, expert_source=experts), models[0](input_ids=ids).logits)
    # the null: the donor serving the picked ones instead moves the logits
    flipped = {k: 1 - v for k, v in experts.items()}
    moved = wg.graft_forward(models, ids, source, expert_source=flipped)
    assert (moved - models[0](input_ids=ids).logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("model_type", ["glm4_moe", "dots1", "deepseek_v3", "lfm2_moe"])
@torch.no_grad()
def test_a_donor_differing_only_in_the_routers_buffer_is_grafted_as_itself(model_type, tmp_path):
    """The routing-score correction bias is a buffer: a graft of the router takes the donor's
    (LFM2-MoE's sits in the block, which passes it to the router: the router slot holds it)."""
    from weightgraft.models.lean import donor_view, needed_parameters

    base = make_tiny(model_type, seed=0).double()
    donor = copy.deepcopy(base)
    buffers = [n for n, _ in donor.named_buffers() if n.endswith(ROUTER_BUFFERS)]
    assert buffers
    for name in buffers:
        donor.get_buffer(name).copy_(torch.linspace(-2.0, 2.0, donor.get_buffer(name).numel()))
    check_compatible([base, donor])
    ids = random_ids(2, 7)
    source = _only(base, tuple(ids.shape), lambda n: n.endswith(".router"))
    with float64_exact([base, donor]):
        got = wg.graft_forward([base, donor], ids, source)
        ref = per_token_forward([base, donor], ids, source)
        plain_base, plain_donor = base(input_ids=ids).logits, donor(input_ids=ids).logits
    assert (got - ref).abs().max().item() <= 1e-10
    assert (got - plain_base).abs().max().item() > 1e-2  # the bias changed routing
    assert (got - plain_donor).abs().max().item() <= 1e-10  # the donor differs only there
    rows = torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(1))[..., None]
    with float64_exact([base, donor]):  # the donor's router at random positions only: each row its own bias
        some = wg.graft_forward([base, donor], ids, source * rows)
        assert (some - per_token_forward([base, donor], ids, source * rows)).abs().max().item() <= 1e-10
    assert min((some - plain_base).abs().max().item(), (some - plain_donor).abs().max().item()) > 1e-3
    routers = [s.name for s in model_slots(base) if s.router]
    assert all(any(p.endswith(ROUTER_BUFFERS) for p in needed_parameters(base, [r])) for r in routers)
    view = donor_view(base, {n: donor.get_buffer(n) for n in buffers})  # a lean donor holding the buffers
    with float64_exact([base, view]):
        assert torch.equal(wg.graft_forward([base, view], ids, source), got)


@pytest.mark.parametrize("model_type", MOE)
@torch.no_grad()
def test_a_lean_donor_holding_only_the_banks_equals_the_full_donor_bit_for_bit(model_type, tmp_path):
    """transformers writes a bank as one tensor per expert (the hub's layout); a lean donor merges
    the banks it serves as loading does, reads nothing else, and hashes as the full donor."""
    from weightgraft.models.hashing import weights_sha256
    from weightgraft.models.lean import lean_from_safetensors, memory_report, needed_parameters

    base = make_tiny(model_type, seed=0)
    donor = make_donor(base, 1)
    donor.save_pretrained(tmp_path / "donor")
    served = [s.name for s in model_slots(base) if s.experts or s.router]
    needed = needed_parameters(base, served)
    lean, digest = lean_from_safetensors(base, tmp_path / "donor", needed)
    assert digest == weights_sha256(donor)
    held = memory_report(lean, base).tensors_held  # a correction bias equal to the base's is shared
    assert held == len([n for n in needed if not n.endswith(ROUTER_BUFFERS)])
    ids = random_ids(2, 7)
    experts = _expert_maps(base, tuple(ids.shape), 2, seed=8)
    source = _only(base, tuple(ids.shape), lambda n: n.endswith(".router"))
    got = wg.graft_forward([base, lean], ids, source, expert_source=experts)
    assert torch.equal(got, wg.graft_forward([base, donor], ids, source, expert_source=experts))
    assert (got - base(input_ids=ids).logits).abs().max().item() > 1e-3


def test_refusals_in_one_line():
    models = _models("mixtral", torch.float32)
    ids = random_ids(1, 5)
    source = torch.zeros(1, 5, len(wg.slots(models[0])), dtype=torch.long)
    with pytest.raises(GraftArgumentError, match="expert_source names 'layers.0.q', which is no expert bank"):
        wg.graft_forward(models, ids, source, expert_source={"layers.0.q": torch.zeros(1, 5, 4, dtype=torch.long)})
    with pytest.raises(GraftArgumentError, match=r"must have shape \[batch, seq, experts\] = \[1, 5, 4\]"):
        wg.graft_forward(models, ids, source, expert_source={"layers.0.experts": torch.zeros(1, 5, 3, dtype=torch.long)})
    other = copy.deepcopy(models[1])
    other.set_experts_implementation("grouped_mm")
    with pytest.raises(ModelMismatchError, match="runs its experts with 'grouped_mm' but the base with 'eager'"):
        check_compatible([models[0], other])
    with pytest.raises(GraftArgumentTypeError, match="layers.0.router .* is a MixtralTopKRouter"):
        PartialGraft(models[0], models[1])  # a router is not affine in its weights


def test_float64_runs_the_default_bank_eagerly_and_restores_it():
    base = make_tiny("qwen3_moe", seed=0).double()
    base.set_experts_implementation("grouped_mm")
    ids = random_ids(1, 5)
    with pytest.raises(RuntimeError):  # grouped_mm refuses float64 on the CPU
        base(input_ids=ids)
    with float64_exact([base]):
        assert base.config._experts_implementation == "eager"
        base(input_ids=ids)
    assert base.config._experts_implementation == "grouped_mm"


def test_dense_first_layers_graft_as_dense():
    model = make_tiny("glm4_moe", randomize=False)
    names = wg.slots(model)
    assert {"layers.0.gate", "layers.0.up", "layers.0.down"} <= set(names)
    assert not any(n.startswith("layers.0.") and n.endswith((".router", ".experts")) for n in names)
    assert {"layers.1.router", "layers.1.experts", "layers.1.shared_up"} <= set(names)
    assert isinstance(model, T.Glm4MoeForCausalLM)


@pytest.mark.parametrize("components", ["router", "experts", "ffn", "shared"])
def test_rules_name_the_router_the_bank_and_the_shared_experts(tiny_pair, tiny_tok, components):
    """``components=router`` (``experts``, ``shared``, ``ffn``: the whole MoE block) in a rule
    grafts exactly those slots, as a hand-built source map does."""
    pre, sft = tiny_pair("qwen2_moe")
    prompts = ["Paris is in", "The cat sat"]
    with float64_exact([pre, sft]):
        out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts,
                       wg.Rule(model="sft", positions="last", components=components))
    group = {"router": (".router",), "experts": (".experts",), "shared": (".shared_",),
             "ffn": (".router", ".experts", ".shared_")}[components]
    last = last_token_reference(pre, sft, tiny_tok, prompts, lambda n: any(g in n for g in group))
    assert (out.logits - last).abs().max().item() <= 1e-10
    plain = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts, wg.Rule(model="pre"))
    assert (out.logits - plain.logits).abs().max().item() > 1e-3


@torch.no_grad()
def test_routing_flips_are_counted_against_another_pass_and_reported_in_half_precision():
    from weightgraft.engine.check import check_engine, routing_flips

    models = _models("mixtral", torch.float32)
    ids, mask = padded_ids()
    source = torch.randint(0, 3, (*ids.shape, len(wg.slots(models[0]))), generator=torch.Generator().manual_seed(9))
    n_routers = sum(1 for s in model_slots(models[0]) if s.router)
    same = routing_flips(models, ids, mask, [source], against=models)  # the null: the same pass
    assert same == (0, int(mask.sum()) * n_routers)
    others = [make_donor(m, seed=7, scale=2.0) for m in models]  # other routers: other picks
    differing, decisions = routing_flips(models, ids, mask, [source], against=others)
    assert decisions == same[1] and differing > decisions // 4
    assert check_engine(models, ids, mask, n_random=1).routing_flips is None  # float32: nothing to say
    half = [m.to(torch.bfloat16) for m in _models("mixtral", torch.float32)]
    report = check_engine(half, ids, mask, n_random=1)
    maps = len(half) + 2  # one uniform map per model, a random and a structured one
    assert report.routing_flips is not None and report.routing_flips[1] == maps * int(mask.sum()) * n_routers


def test_a_rule_grafts_chosen_experts_as_the_expert_map_does(tiny_pair, tiny_tok):
    """``Rule(components="experts", experts="1,3")``: those experts of every bank at the rule's
    positions, the others the base's; equal to the per-token definition with that expert map."""
    pre, sft = tiny_pair("qwen2_moe")
    prompts = ["Paris is in", "The cat sat"]
    rule = wg.Rule(model="sft", positions="last", layers="last_half", components="experts", experts="1,3")
    with float64_exact([pre, sft]):
        out = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts, rule)
    enc = tiny_tok(prompts, padding=True, return_tensors="pt")
    names = wg.slots(pre)
    banks = [s for s in model_slots(pre) if s.experts and int(s.name.split(".")[1]) >= 2]  # the last half of 4 layers
    experts = {s.name: torch.zeros(*enc["input_ids"].shape, s.experts, dtype=torch.long) for s in banks}
    for b, p in enumerate(prompts):
        for m in experts.values():
            m[b, len(p) - 1, [1, 3]] = 1
    source = torch.zeros(*enc["input_ids"].shape, len(names), dtype=torch.long)
    with float64_exact([pre, sft]):
        want = per_token_forward([pre, sft], enc["input_ids"], SourceMap(source, experts=experts),
                                 attention_mask=enc["attention_mask"])
    last = want[torch.arange(len(prompts)), torch.tensor([len(p) - 1 for p in prompts])]
    assert (out.logits - last).abs().max().item() <= 1e-10
    everything = wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts,
                          wg.Rule(model="sft", positions="last", layers="last_half", components="experts"))
    assert (out.logits - everything.logits).abs().max().item() > 1e-4  # two experts are not the bank
    with pytest.raises(wg.GraftInputError, match="experts=.1,3. applies to experts only"):
        wg.graft({"pre": pre, "sft": sft}, tiny_tok, prompts,
                 wg.Rule(model="sft", positions="last", components="experts+router", experts="1,3"))
