"""Multi-head latent attention (DeepSeek-V3 / V2) against the per-token definition: the weights applied
to a key or value (kv_a, kv_a_norm, kv_b) are its own position's model's, the query's (q_a, q_a_norm,
q_b, or q) the query position's. transformers caches the latent and decompresses every cached latent
with the current kv_b; the reference and any pass continued from a cache keep each position's keys
and values as its own kv_b made them (``weightgraft.engine.attention.latent``). The family's mixture
of experts is in test_moe.py's matrix."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from tiny_models import MOE_CONFIGS, make_donor, random_ids

import weightgraft as wg
from weightgraft.engine import reference
from weightgraft.engine.forward import graft_call
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError


def _models(q_lora_rank: int | None = 16) -> list[torch.nn.Module]:
    config = copy.deepcopy(MOE_CONFIGS["deepseek_v3"])
    config.q_lora_rank = q_lora_rank
    torch.manual_seed(0)
    base = T.AutoModelForCausalLM.from_config(config).eval().double()
    with torch.no_grad():  # the tiny models' large random weights, so every slot moves the logits
        gen = torch.Generator().manual_seed(0)
        for p in base.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_((1 + 0.3 * noise) if p.dim() == 1 else noise / p.shape[-1] ** 0.5)
    return [base, make_donor(base, 1), make_donor(base, 2)]


def _only(names: list[str], shape: tuple[int, int], suffix: str, position: int) -> torch.Tensor:
    source = torch.zeros(*shape, len(names), dtype=torch.long)
    source[:, position, [i for i, n in enumerate(names) if n.endswith(suffix)]] = 1
    return source


@torch.no_grad()
def test_kv_b_grafted_at_one_position_serves_that_key_and_value_only():
    """kv_b from the donor at position 2 only: the engine equals the reference; positions 0-1 are the
    base's bit for bit; later positions move, and differ from the query-position reading (every
    cached latent decompressed by the query's kv_b, as transformers' own cache steps)."""
    models = _models()[:2]
    ids = random_ids(2, 7)
    names = wg.slots(models[0])
    source = _only(names, tuple(ids.shape), ".kv_b", 2)
    with float64_exact(models):
        fast = wg.graft_forward(models, ids, source)
        ref = reference.per_token_forward(models, ids, source)
        plain = models[0](input_ids=ids).logits
        assert (fast - ref).abs().max().item() <= 1e-10
        assert torch.equal(fast[:, :2], plain[:, :2])
        assert (fast[:, 2:] - plain[:, 2:]).abs().amin(dim=-1).amax().item() > 0  # every later position moves
        assert (fast[:, 3:] - plain[:, 3:]).abs().max().item() > 1e-2
        # the query-position reading: at step 2 every earlier key is decompressed by the donor's kv_b,
        # after it by the base's: another function, not what is grafted here
        unadapted = reference.latent_attention_paths
        reference.latent_attention_paths = lambda slot_list: []
        try:
            by_query = reference.per_token_forward(models, ids, source)
        finally:
            reference.latent_attention_paths = unadapted
        assert (by_query[:, :2] - ref[:, :2]).abs().max().item() <= 1e-10
        assert (by_query[:, 2:] - ref[:, 2:]).abs().max().item() > 1e-2


@pytest.mark.parametrize("q_lora_rank", [16, None])
@torch.no_grad()
def test_each_attention_component_alone_and_a_full_query_projection(q_lora_rank):
    """Each MLA component grafted alone at one position equals the reference; with q_lora_rank None
    (DeepSeek-V2-Lite) the query is one projection, the slot ``q``."""
    models = _models(q_lora_rank)
    names = wg.slots(models[0])
    parts = ("q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b", "o")
    present = sorted({n.split(".")[2] for n in names if n.startswith("layers.0.")} & {"q", *parts})
    assert present == (sorted(["q", "kv_a", "kv_a_norm", "kv_b", "o"]) if q_lora_rank is None else sorted(parts))
    ids = random_ids(2, 7)
    with float64_exact(models):
        plain = models[0](input_ids=ids).logits
        for part in present:
            source = _only(names, tuple(ids.shape), f".{part}", 3)
            fast = wg.graft_forward(models, ids, source)
            ref = reference.per_token_forward(models, ids, source)
            assert (fast - ref).abs().max().item() <= 1e-10, part
            assert torch.equal(fast[:, :3], plain[:, :3]), part
            assert (fast - plain).abs().max().item() > 1e-3, part
        source = torch.randint(0, 3, (*ids.shape, len(names)), generator=torch.Generator().manual_seed(1))
        fast = wg.graft_forward(models, ids, source)
        assert (fast - reference.per_token_forward(models, ids, source)).abs().max().item() <= 1e-10


@torch.no_grad()
def test_a_pass_continued_from_its_cache_equals_the_whole_pass():
    """The cache holds keys and values decompressed at their own positions, so a grafted pass split
    in two (prefix sharing, generation) equals one pass; a cache of latents is refused."""
    models = _models()
    ids = random_ids(2, 8)
    names = wg.slots(models[0])
    source = torch.randint(0, 3, (*ids.shape, len(names)), generator=torch.Generator().manual_seed(2))
    with float64_exact(models):
        whole = wg.graft_forward(models, ids, source)
        cache = T.DynamicCache(config=models[0].config)
        first = graft_call(models, ids[:, :5], SourceMap(source[:, :5]), past_key_values=cache).logits
        rest = graft_call(models, ids[:, 5:], SourceMap(source[:, 5:]), past_key_values=cache,
                          attention_mask=torch.ones(2, 8, dtype=torch.long)).logits
        assert (torch.cat([first, rest], dim=1) - whole).abs().max().item() <= 1e-10
        assert cache.layers[0].keys.shape == (2, 4, 8, 12)  # [batch, heads, seq, nope + rope]
        latents = T.DynamicCache(config=models[0].config)
        models[0](input_ids=ids[:, :5], past_key_values=latents, use_cache=True)  # transformers' own cache
        with pytest.raises(GraftArgumentError, match="cache holds .* keys, not the decompressed"):
            graft_call(models, ids[:, 5:], SourceMap(source[:, 5:]), past_key_values=latents,
                       attention_mask=torch.ones(2, 8, dtype=torch.long))


@pytest.mark.slow
@torch.no_grad()
def test_o_per_head_and_the_check_command_cases():
    """``o`` grafts head by head (its input columns, ``v_head_dim`` per head) as the reference does, and
    ``weightgraft check``'s cases pass, its prefix- and depth-sharing paths (caches) included."""
    from weightgraft.engine.check import check_engine

    models = _models()[:2]
    ids = random_ids(2, 7)
    names = wg.slots(models[0])
    heads = {"layers.1.o": torch.zeros(2, 7, 4, dtype=torch.long)}
    heads["layers.1.o"][:, 4:, 1] = 1
    source = torch.zeros(*ids.shape, len(names), dtype=torch.long)
    with float64_exact(models):
        fast = wg.graft_forward(models, ids, source, head_source=heads)
        ref = reference.per_token_forward(models, ids, SourceMap(source, heads))
        assert (fast - ref).abs().max().item() <= 1e-10
        assert (fast - models[0](input_ids=ids).logits).abs().max().item() > 1e-3
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    report = check_engine(models, ids, mask, n_random=1)
    assert report.cases and all(case.max_abs_diff <= 1e-10 for case in report.cases)
    assert {"prefix sharing (runner)", "depth sharing (cells)"} <= {case.name for case in report.cases}
