"""The fast engine against the per-token KV-cache definition, on every architecture."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from tiny_models import HYBRID_CONFIGS, MOE_CONFIGS, TINY_CONFIGS, make_donor, make_tiny, random_ids, tiny_models

import weightgraft as wg
from weightgraft.engine.architectures import UnsupportedArchitectureError, model_slots
from weightgraft.engine.compat import ModelMismatchError
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap

ARCHS = sorted(TINY_CONFIGS)
TOL = 1e-4


def _tol(model_type: str, ref: torch.Tensor) -> float:
    """TOL, of the logit scale for a mixture of experts (routing in float32, as test_moe.py checks it)
    and a hybrid (a chunked float32 scan: issue 61's bound, as test_mixers.py checks it)."""
    relative = model_type in MOE_CONFIGS or model_type in HYBRID_CONFIGS
    return TOL * max(1.0, ref.abs().max().item()) if relative else TOL


def _random_source(models, batch, seq, seed) -> torch.Tensor:
    n_slots = len(wg.slots(models[0]))
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(models), (batch, seq, n_slots), generator=gen)


@pytest.mark.parametrize("n_models", [2, 3])
@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_random_source_maps_match_the_per_token_definition(model_type, n_models):
    models = tiny_models(model_type, n_models)
    ids = random_ids(2, 9)
    for seed in range(2):
        source = _random_source(models, 2, 9, seed)
        fast = wg.graft_forward(models, ids, source)
        ref = per_token_forward(models, ids, source)
        assert (fast - ref).abs().max().item() <= _tol(model_type, ref)
        # The comparison means something: grafting moved the logits far from the base's.
        assert (ref - models[0](ids).logits).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_uniform_sources_reproduce_each_model(model_type):
    models = tiny_models(model_type, 3)
    ids = random_ids(2, 7)
    shape = (2, 7, len(wg.slots(models[0])))
    for m, model in enumerate(models):
        got = wg.graft_forward(models, ids, torch.full(shape, m))
        assert (got - model(ids).logits).abs().max().item() <= TOL


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_padded_batch_equals_one_sequence_at_a_time(model_type, padding_side):
    models = tiny_models(model_type, 3)
    lengths = [9, 5, 7]
    seq = max(lengths)
    ids = torch.zeros(len(lengths), seq, dtype=torch.long)
    mask = torch.zeros_like(ids)
    source = _random_source(models, len(lengths), seq, seed=3)
    rows = []
    for b, n in enumerate(lengths):
        row = random_ids(1, n, seed=10 + b)[0]
        span = slice(0, n) if padding_side == "right" else slice(seq - n, seq)
        ids[b, span], mask[b, span] = row, 1
        rows.append(span)
    batched = wg.graft_forward(models, ids, source, attention_mask=mask)
    oracle = per_token_forward(models, ids, source, attention_mask=mask)
    for b, span in enumerate(rows):
        alone = wg.graft_forward(models, ids[b : b + 1, span], source[b : b + 1, span])
        tol = _tol(model_type, oracle[b, span])
        assert (batched[b, span] - alone[0]).abs().max().item() <= tol
        assert (batched[b, span] - oracle[b, span]).abs().max().item() <= tol


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_fused_and_separate_qkv_graft_the_right_projection(model_type):
    """Independent of the slot table: with the donor's q at position 0 only, nothing changes
    (position 0 attends to one key; later positions never read q_0); with k at position 0 only,
    position 0 is unchanged but later positions move; with v at position 0, position 0 moves. (A
    layer whose keys are its values, Gemma 4's full attention with ``attention_k_eq_v``, has no v:
    its k is left out of the k check.)"""
    models = tiny_models(model_type, 2)
    base = models[0]
    names = wg.slots(base)
    ids = random_ids(1, 6)
    plain = base(ids).logits
    for comp in ("q", "k", "v"):
        source = torch.zeros(1, 6, len(names), dtype=torch.long)
        for i, name in enumerate(names):
            values_apart = comp != "k" or f"{name[:-2]}.v" in names
            if name.endswith(f".{comp}") and values_apart:
                source[0, 0, i] = 1
        delta = (wg.graft_forward(models, ids, source) - plain).abs().amax(-1)[0]
        if comp == "q":
            assert delta.max().item() <= TOL
        elif comp == "k":
            assert delta[0].item() <= TOL and delta[1:].max().item() > 100 * TOL
        else:
            assert delta[0].item() > 100 * TOL


def _tied(model_type: str) -> bool:
    model = make_tiny(model_type, randomize=False)
    return model.get_input_embeddings().weight is model.get_output_embeddings().weight


@pytest.mark.parametrize("model_type", [m for m in ARCHS if _tied(m)])
@torch.no_grad()
def test_embed_graft_on_tied_model_leaves_unembedding(model_type):
    base = make_tiny(model_type)
    donor = make_donor(base, seed=1)
    assert base.get_input_embeddings().weight is base.get_output_embeddings().weight
    ids = random_ids(2, 6)
    names = wg.slots(base)
    source = torch.zeros(2, 6, len(names), dtype=torch.long)
    embeds = [i for i, n in enumerate(names) if n in ("embed", "pos_embed")]
    source[..., embeds] = 1
    got = wg.graft_forward([base, donor], ids, source)

    # Built by hand: donor input embedding, base output embedding (untied).
    expected_model = copy.deepcopy(base)
    expected_model.lm_head.weight = torch.nn.Parameter(base.lm_head.weight.detach().clone())
    for part in [p for s in model_slots(base) if s.name in ("embed", "pos_embed") for p in s.parts]:
        expected_model.get_submodule(part.path).weight.copy_(donor.get_submodule(part.path).weight)
    expected = expected_model(ids).logits
    assert (got - expected).abs().max().item() <= TOL
    # What the tied-weights trap would give (the unembedding swapped too) is far away.
    trapped = copy.deepcopy(base)
    trapped.get_input_embeddings().weight.copy_(donor.get_input_embeddings().weight)
    assert (got - trapped(ids).logits).abs().max().item() > 100 * TOL
    # And the base's weights were not touched.
    assert base.get_input_embeddings().weight is base.get_output_embeddings().weight


@pytest.mark.parametrize("model_type", ARCHS)
def test_every_parameter_belongs_to_exactly_one_slot_name(model_type):
    model = make_tiny(model_type)
    names = wg.slots(model)
    assert names[0] == "embed" and names[-1] == "unembed"
    assert len(names) == len(set(names))
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    for i in range(n_layers):  # a hybrid's mixer layer has a token mixer in attention's place
        mixes = f"layers.{i}.q" in names or f"layers.{i}.mixer_out" in names
        mlp_block = f"layers.{i}.down" in names and model_type == "nemotron_h"  # one sublayer a block there
        assert mlp_block or mixes and (f"layers.{i}.o" in names or f"layers.{i}.mixer_out" in names)


@torch.no_grad()
def test_source_is_not_modified_and_models_stay_untouched():
    models = tiny_models("llama", 2)
    before = [p.clone() for p in models[1].parameters()]
    ids = random_ids(1, 5)
    source = _random_source(models, 1, 5, seed=0)
    keep = source.clone()
    wg.graft_forward(models, ids, source)
    assert torch.equal(source, keep)
    assert all(torch.equal(a, b) for a, b in zip(before, models[1].parameters()))
    assert all(not m._forward_hooks for m in models[0].modules())


def test_unknown_architecture_is_refused_with_the_supported_list():
    model = T.AutoModelForCausalLM.from_config(
        T.OPTConfig(hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                    vocab_size=32, word_embed_proj_dim=16)
    )
    with pytest.raises(UnsupportedArchitectureError, match="'opt' is not supported.*llama"):
        wg.slots(model)


def test_unsupported_config_option_is_refused():
    config = copy.deepcopy(TINY_CONFIGS["gpt2"])
    config.add_cross_attention = True
    model = T.AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedArchitectureError, match="add_cross_attention"):
        wg.slots(model)


def test_mismatched_models_are_refused_naming_the_tensor():
    base = make_tiny("llama")
    wider = copy.deepcopy(TINY_CONFIGS["llama"])
    wider.intermediate_size = 64
    other = T.AutoModelForCausalLM.from_config(wider)
    ids = random_ids(1, 4)
    source = torch.zeros(1, 4, len(wg.slots(base)), dtype=torch.long)
    with pytest.raises(ModelMismatchError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight"):
        wg.graft_forward([base, other], ids, source)
    bigger_vocab = copy.deepcopy(TINY_CONFIGS["llama"])
    bigger_vocab.vocab_size = 80
    with pytest.raises(ModelMismatchError, match=r"embed_tokens\.weight"):
        wg.graft_forward([base, T.AutoModelForCausalLM.from_config(bigger_vocab)], ids, source)
    with pytest.raises(ModelMismatchError, match="'gpt2' model"):
        wg.graft_forward([base, make_tiny("gpt2")], ids, source)


def test_bad_source_is_refused():
    models = tiny_models("llama", 2)
    ids = random_ids(1, 4)
    n = len(wg.slots(models[0]))
    with pytest.raises(ValueError, match="shape"):
        wg.graft_forward(models, ids, torch.zeros(1, 4, n - 1, dtype=torch.long))
    with pytest.raises(ValueError, match="index the 2 models"):
        wg.graft_forward(models, ids, torch.full((1, 4, n), 2))
    with pytest.raises(TypeError, match="integer"):
        wg.graft_forward(models, ids, torch.zeros(1, 4, n))


def test_slot_table_is_bound_to_real_modules():
    model = make_tiny("gpt_neox")
    slot = {s.name: s for s in model_slots(model)}
    q = slot["layers.0.q"].parts[0].columns
    # GPT-NeoX interleaves per head: head 0 is [q0 | k0 | v0], so q's columns are not contiguous.
    head_dim = 32 // 4
    assert q[:head_dim].tolist() == list(range(head_dim))
    assert q[head_dim].item() == 3 * head_dim


@pytest.mark.parametrize("model_type", ["gpt2", "gemma2", "llama"])
@torch.no_grad()
def test_logits_at_chosen_positions_equal_the_full_logits(model_type):
    models = tiny_models(model_type, 3)
    ids = random_ids(3, 8)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding: row 1 ends at position 5
    source = _random_source(models, 3, 8, seed=5)
    positions = torch.tensor([[7, 3], [5, 0], [2, 7]])
    full = wg.graft_forward(models, ids, source, attention_mask=mask)
    some = wg.graft_forward(models, ids, source, attention_mask=mask, logit_positions=positions)
    assert some.shape == (3, 2, full.shape[-1])
    expected = full.gather(1, positions[:, :, None].expand(-1, -1, full.shape[-1]))
    assert (some - expected).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="logit_positions"):
        wg.graft_forward(models, ids, source, logit_positions=torch.tensor([[8], [0], [0]]))


@pytest.mark.parametrize("model_type", ["gemma", "gpt_neox"])
@torch.no_grad()
def test_papers_copy_per_position_procedure_equals_the_incremental_oracle(model_type):
    models = tiny_models(model_type, 3)
    ids = random_ids(2, 6)
    source = _random_source(models, 2, 6, seed=7)
    fresh = per_token_forward(models, ids, source, copy_per_position=True)
    incremental = per_token_forward(models, ids, source)
    assert (fresh - incremental).abs().max().item() <= 1e-6


def _random_heads(models, batch, seq, seed) -> dict[str, torch.Tensor]:
    """Per-head maps for a few q/k/v/o slots (all of the first attention layer, o and v of the last
    one: a hybrid's mixer layers have no heads)."""
    slot_list = model_slots(models[0])
    attention = [int(s.name.split(".")[1]) for s in slot_list if s.name.endswith(".q")]
    first, last = min(attention), max(attention)
    wanted = {f"layers.{first}.{c}" for c in "qkvo"} | {f"layers.{last}.o", f"layers.{last}.v"}
    gen = torch.Generator().manual_seed(seed)
    return {
        s.name: torch.randint(0, len(models), (batch, seq, s.heads), generator=gen)
        for s in slot_list if s.name in wanted
    }


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_per_head_maps_match_the_per_token_definition(model_type):
    models = tiny_models(model_type, 3)
    ids = random_ids(2, 8)
    source = _random_source(models, 2, 8, seed=5)
    heads = _random_heads(models, 2, 8, seed=6)
    assert {n.rsplit(".", 1)[1] for n in heads} >= {"q", "o"}
    fast = wg.graft_forward(models, ids, source, head_source=heads)
    ref = per_token_forward(models, ids, SourceMap(source, heads))
    assert (fast - ref).abs().max().item() <= _tol(model_type, ref)
    # The head maps matter: without them the result is another one.
    plain = per_token_forward(models, ids, source)
    assert (ref - plain).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gpt_neox"])
@torch.no_grad()
def test_one_donor_head_changes_only_through_that_head(model_type):
    """Grafting one head of o at the last position equals grafting o with a donor whose other
    heads' input columns were set to the base's: the head is the unit, nothing leaks."""
    base = make_tiny(model_type, seed=0)
    donor = make_donor(base, seed=1)
    slot = next(s for s in model_slots(base) if s.name == "layers.1.o")
    path = slot.parts[0].path
    module = base.get_submodule(path)
    cols = slot.head_columns(module)
    hybrid = copy.deepcopy(donor)
    target = hybrid.get_submodule(path)
    for h in range(slot.heads):
        if h == 1:
            continue
        if isinstance(target, T.pytorch_utils.Conv1D):
            target.weight[cols[h]] = module.weight[cols[h]]
        else:
            target.weight[:, cols[h]] = module.weight[:, cols[h]]
    if target.bias is not None:
        target.bias.copy_(module.bias)
    ids = random_ids(1, 6)
    names = wg.slots(base)
    source = torch.zeros(1, 6, len(names), dtype=torch.long)
    head_map = torch.zeros(1, 6, slot.heads, dtype=torch.long)
    head_map[0, -1, 1] = 1
    per_head = wg.graft_forward([base, donor], ids, source, head_source={"layers.1.o": head_map})
    whole = source.clone()
    whole[0, -1, names.index("layers.1.o")] = 1
    via_hybrid = wg.graft_forward([base, hybrid], ids, whole)
    assert (per_head - via_hybrid).abs().max().item() <= TOL
    assert (per_head - base(ids).logits).abs().max().item() > 100 * TOL


def test_bad_head_source_is_refused():
    models = tiny_models("llama", 2)
    ids = random_ids(1, 4)
    source = torch.zeros(1, 4, len(wg.slots(models[0])), dtype=torch.long)
    with pytest.raises(ValueError, match="cannot be grafted per head"):
        wg.graft_forward(models, ids, source, head_source={"layers.0.up": torch.zeros(1, 4, 4, dtype=torch.long)})
    with pytest.raises(ValueError, match="not a slot"):
        wg.graft_forward(models, ids, source, head_source={"layers.99.q": torch.zeros(1, 4, 4, dtype=torch.long)})
    heads = next(s for s in model_slots(models[0]) if s.name == "layers.0.q").heads
    with pytest.raises(ValueError, match=r"shape \[batch, seq, heads\]"):
        wg.graft_forward(models, ids, source, head_source={"layers.0.q": torch.zeros(1, 4, heads + 1, dtype=torch.long)})
