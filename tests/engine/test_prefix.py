"""Prefix sharing against running each item whole and against the per-token definition."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_CONFIGS, WITH_MIXERS, tiny_models

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.reference import CompositeModel, per_token_forward
from weightgraft.engine.sharing.prefix import GraftItem, PrefixGroup, prefix_forward, shared_prefix_groups
from weightgraft.engine.source_map import SourceMap

# the hybrids' caches hold recurrent layers, which prefix sharing does not share: their items run whole
# (exact: tests/engine/test_mixers.py)
ARCHS = sorted(m for m in TINY_CONFIGS if m not in WITH_MIXERS)
TOL = 1e-4


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _sweep_items(models) -> list[GraftItem]:
    """A small sweep: per example, the base, the last token grafted, a 3-model map and the same
    map re-drawn on its last two (answer) positions, one per-head map that equals the base
    before its last position, one item grafted early (it shares one position only), and the
    donor alone next to "donor body everywhere but the last token" (their prefixes differ only
    in the unembedding, which no prefix uses)."""
    slot_list = model_slots(models[0])
    n_slots = len(slot_list)
    q_first = next(s for s in slot_list if s.name == "layers.0.q")
    o_last = next(s for s in reversed(slot_list) if s.name.endswith(".o"))
    gen = torch.Generator().manual_seed(0)
    items = []
    for example, n in enumerate((9, 6)):
        ids = _tokens(n, seed=example)
        base = torch.zeros(n, n_slots, dtype=torch.long)
        last = base.clone()
        last[-1] = 1
        mixed = torch.randint(0, len(models), (n, n_slots), generator=gen)
        answer = mixed.clone()
        answer[-2:] = torch.randint(0, len(models), (2, n_slots), generator=gen)
        heads = torch.zeros(n, o_last.heads, dtype=torch.long)
        heads[-1, 1], heads[-1, 2] = 1, 2
        early = base.clone()
        early[1] = 2
        donor = torch.ones(n, n_slots, dtype=torch.long)
        donor_body = donor.clone()
        donor_body[-1], donor_body[:, -1] = 0, 0  # "unembed" is the last slot
        items += [
            GraftItem(ids, SourceMap(base)),
            GraftItem(ids, SourceMap(last)),
            GraftItem(ids, SourceMap(mixed)),
            GraftItem(ids, SourceMap(answer), logit_start=-2, n_logits=2),
            GraftItem(ids, SourceMap(base, {q_first.name: base[:, :q_first.heads], o_last.name: heads})),
            GraftItem(ids, SourceMap(early)),
            GraftItem(ids, SourceMap(donor)),
            GraftItem(ids, SourceMap(donor_body)),
        ]
    ids = _tokens(4, seed=7)  # a short example: its prefix is left-padded the most
    short = torch.zeros(4, n_slots, dtype=torch.long)
    short_last = short.clone()
    short_last[-1] = 2
    return items + [GraftItem(ids, SourceMap(short)), GraftItem(ids, SourceMap(short_last))]


def _wanted(logits: torch.Tensor, item: GraftItem, k: int) -> torch.Tensor:
    """``[k, vocab]``: an item's wanted positions out of its full logits, last one repeated."""
    start = item.first_logit()
    positions = [start + min(j, item.n_logits - 1) for j in range(k)]
    return logits[positions]


def _alone(models, item: GraftItem) -> torch.Tensor:
    return wg.graft_forward(models, torch.tensor([item.input_ids]), item.maps.batch_of_one())[0]


def _oracle(models, item: GraftItem, composite: CompositeModel) -> torch.Tensor:
    ids = torch.tensor([item.input_ids])
    return per_token_forward(models, ids, item.maps.batch_of_one(), composite=composite)[0]


@pytest.mark.parametrize("model_type", ARCHS)
@torch.no_grad()
def test_prefix_forward_equals_each_item_alone_and_the_per_token_definition(model_type):
    models = tiny_models(model_type, 3)
    items = _sweep_items(models)
    plan = shared_prefix_groups(items, slot_names=wg.slots(models[0]))
    assert plan.groups and plan.unshared  # both paths run
    assert PrefixGroup(8, (6, 7)) in plan.groups  # the donor and its body share
    got = prefix_forward(models, items, pad_id=0)
    k = max(item.n_logits for item in items)
    assert got.shape == (len(items), k, TINY_CONFIGS[model_type].get_text_config(decoder=True).vocab_size)
    composite = CompositeModel(models)
    for i, item in enumerate(items):
        assert (got[i] - _wanted(_alone(models, item), item, k)).abs().max().item() <= TOL
        assert (got[i] - _wanted(_oracle(models, item, composite), item, k)).abs().max().item() <= TOL
    # The comparison means something: grafting the last token moved its logits.
    assert (got[0] - got[1]).abs().max().item() > 100 * TOL


def _item(tokens: str, rows: str, logit_start: int = -1, n_logits: int = 1, heads=None) -> GraftItem:
    """Hand-built item: one character per position; ``rows`` gives the model of all 3 slots."""
    source = torch.tensor([[int(c)] * 3 for c in rows], dtype=torch.long)
    return GraftItem([ord(c) for c in tokens], SourceMap(source, heads or {}), logit_start, n_logits)


def test_grouping_on_a_hand_built_batch():
    items = [
        _item("abcdef", "000000"),  # 0: base
        _item("abcdef", "000001"),  # 1: last token grafted: shares 5 with 0
        _item("abcdef", "000111", logit_start=3, n_logits=3),  # 2: shares 3, capped at its logits
        _item("abcxyz", "000000"),  # 3: shares 3 with 0, 1 and 2
        _item("qrstuv", "000000"),  # 4: shares nothing
        _item("qxxxxx", "000000"),  # 5: shares 1 with 4: under min_shared
        _item("abcdef", "010000"),  # 6: shares 1 with the others
    ]
    plan = shared_prefix_groups(items, min_shared=2)
    assert plan.groups == (PrefixGroup(5, (0, 1)), PrefixGroup(3, (2, 3)))
    assert plan.unshared == (4, 5, 6)
    assert shared_prefix_groups(items, min_shared=4).groups == (PrefixGroup(5, (0, 1)),)
    # A partner whose logits start earlier limits what is shared with it.
    capped = shared_prefix_groups([_item("abcdef", "000000"), _item("abcdef", "000000", logit_start=2)])
    assert capped.groups == (PrefixGroup(2, (0, 1)),)


def test_grouping_compares_head_maps_with_the_source_they_replace():
    heads_like_source = {"b": torch.tensor([[0, 0]] * 5 + [[1, 0]])}
    with_heads = _item("abcdef", "000000", heads=heads_like_source)
    items = [_item("abcdef", "000000"), with_heads]
    # Slot "b" (index 1) served whole by the base equals heads all served by the base...
    assert shared_prefix_groups(items, slot_names=["a", "b", "c"]).groups == (PrefixGroup(5, (0, 1)),)
    # ...which grouping can only know with the slot table; without it, it shares nothing.
    assert shared_prefix_groups(items).unshared == (0, 1)
    # The unembedding (and final norm) of a prefix position serve no logit anyone reads.
    output_differs = [_item("abcdef", "111111"), _item("abcdef", "111110")]
    output_differs[1].maps.slots[:, 2] = 0  # base unembedding everywhere
    shared = shared_prefix_groups(output_differs, slot_names=["a", "b", "unembed"])
    assert shared.groups == (PrefixGroup(5, (0, 1)),)
    assert shared_prefix_groups(output_differs, slot_names=["a", "b", "c"]).groups == ()
    other_heads = {"b": torch.tensor([[0, 1]] * 6)}
    items = [_item("abcdef", "000000"), _item("abcdef", "000000", heads=other_heads)]
    assert shared_prefix_groups(items, slot_names=["a", "b", "c"]).unshared == (0, 1)


class _EmbeddingCalls:
    """Records the ``[batch, seq]`` shape of every call to the base's input embedding."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self._record)

    def _record(self, module, args) -> None:
        self.shapes.append(tuple(args[0].shape))


@torch.no_grad()
def test_each_group_prefix_is_computed_once():
    models = tiny_models("llama", 3)
    items = _sweep_items(models)
    plan = shared_prefix_groups(items, slot_names=wg.slots(models[0]))
    grouped = sorted(i for g in plan.groups for i in g.members)
    calls = _EmbeddingCalls(models[0])
    try:
        prefix_forward(models, items, pad_id=0)
    finally:
        calls.handle.remove()
    group_of = plan.group_of()
    longest_suffix = max(len(items[i]) - plan.groups[group_of[i]].length for i in grouped)
    assert calls.shapes == [
        (len(plan.groups), max(g.length for g in plan.groups)),  # one row per group
        (len(grouped), longest_suffix),  # then only the suffixes
        (len(plan.unshared), max(len(items[i]) for i in plan.unshared)),
    ]


@torch.no_grad()
def test_a_batch_sharing_nothing_runs_whole_in_one_call():
    models = tiny_models("gpt2", 2)
    n_slots = len(wg.slots(models[0]))
    items = [GraftItem(_tokens(n, seed=n), SourceMap(torch.ones(n, n_slots, dtype=torch.long))) for n in (5, 8, 3)]
    assert shared_prefix_groups(items).groups == ()
    calls = _EmbeddingCalls(models[0])
    try:
        got = prefix_forward(models, items, pad_id=0)
    finally:
        calls.handle.remove()
    assert calls.shapes == [(3, 8)]
    for i, item in enumerate(items):
        assert (got[i, 0] - _alone(models, item)[-1]).abs().max().item() <= TOL


@torch.no_grad()
def test_answer_continuation_logits_are_padded_with_the_last_wanted():
    models = tiny_models("qwen2", 2)
    n_slots = len(wg.slots(models[0]))
    ids = _tokens(8, seed=3)
    base = torch.zeros(8, n_slots, dtype=torch.long)
    answer = base.clone()
    answer[5:] = 1
    items = [
        GraftItem(ids, SourceMap(base), logit_start=4, n_logits=3),
        GraftItem(ids, SourceMap(answer), logit_start=5, n_logits=2),
    ]
    assert shared_prefix_groups(items).groups == (PrefixGroup(4, (0, 1)),)
    got = prefix_forward(models, items, pad_id=0)
    assert got.shape[:2] == (2, 3)
    for i, item in enumerate(items):
        assert (got[i] - _wanted(_alone(models, item), item, 3)).abs().max().item() <= TOL
    assert torch.equal(got[1, 2], got[1, 1])


@torch.no_grad()
def test_graft_forward_continues_from_a_cache():
    """The engine option prefix sharing rests on: two calls on a cache equal one call."""
    from transformers import DynamicCache

    models = tiny_models("gemma2", 3)
    ids = torch.tensor([_tokens(9, seed=1)])
    source = torch.randint(0, 3, (1, 9, len(wg.slots(models[0]))), generator=torch.Generator().manual_seed(1))
    whole = wg.graft_forward(models, ids, source)
    cache = DynamicCache(config=models[0].config)
    first = wg.graft_forward(models, ids[:, :5], source[:, :5], past_key_values=cache)
    second = wg.graft_forward(models, ids[:, 5:], source[:, 5:], past_key_values=cache)
    assert (torch.cat([first, second], dim=1) - whole).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="9 cached positions"):
        wg.graft_forward(
            models, ids[:, :2], source[:, :2], attention_mask=torch.ones(1, 2), past_key_values=cache
        )


def test_bad_items_are_refused():
    models = tiny_models("llama", 2)
    n_slots = len(wg.slots(models[0]))
    source = torch.zeros(4, n_slots, dtype=torch.long)
    with pytest.raises(ValueError, match="do not fit"):
        prefix_forward(models, [GraftItem([5, 6, 7, 8], SourceMap(source), logit_start=-1, n_logits=2)], pad_id=0)
    with pytest.raises(ValueError, match="source"):
        prefix_forward(models, [GraftItem([5, 6, 7], SourceMap(source))], pad_id=0)
    with pytest.raises(ValueError, match="not a slot"):
        prefix_forward(models, [GraftItem([5, 6, 7, 8], SourceMap(source, {"layers.9.q": source[:, :4]}))], pad_id=0)
    with pytest.raises(ValueError, match="cannot be grafted per head"):
        prefix_forward(models, [GraftItem([5, 6, 7, 8], SourceMap(source, {"layers.0.up": source[:, :4]}))], pad_id=0)
    with pytest.raises(ValueError, match="at least one item"):
        prefix_forward(models, [], pad_id=0)


@torch.no_grad()
def test_an_unchecked_cache_kind_falls_back_to_running_whole(monkeypatch):
    from transformers.cache_utils import DynamicLayer

    class _OtherLayer(DynamicLayer):
        pass

    models = tiny_models("llama", 2)
    items = _sweep_items(models)[:4]
    expected = prefix_forward(models, items, pad_id=0)
    other_cache = type("OtherCache", (), {"layers": [_OtherLayer()]})
    monkeypatch.setattr("weightgraft.engine.sharing.prefix.DynamicCache", lambda config: other_cache())
    calls = _EmbeddingCalls(models[0])
    try:
        with pytest.warns(UserWarning, match="_OtherLayer cache layers; running every item whole"):
            got = prefix_forward(models, items, pad_id=0)
    finally:
        calls.handle.remove()
    assert calls.shapes == [(4, 9)]
    assert (got - expected).abs().max().item() <= TOL
