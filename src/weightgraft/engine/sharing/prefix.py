"""Prefix sharing: compute positions that many rows share once, then each row's own suffix.

In a sweep many (example, scheme) items have the same tokens and the same source rows for a
leading stretch of positions (scheme PRE and "last token grafted" differ only at the last
position). Keys and values at position t depend only on positions <= t and the weights chosen
for them, so such a shared prefix can run once, into a KV cache, and every item then runs only
its remaining positions on a copy of that cache row. The result is the same as running each
item whole (``weightgraft.engine.forward.graft_forward``), for fewer token-rows of work.

Three batched calls at most: all group prefixes (left-padded), all suffixes (right-padded, on the
cache rows of their group), and the items that share nothing (plain ``graft_forward``).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from weightgraft.engine.architectures import Slot, UnitKind, Units, model_slots
from weightgraft.engine.forward import graft_forward
from weightgraft.engine.precision import is_half
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["GraftItem", "PrefixGroup", "PrefixPlan", "Segment", "PaddedBatch", "shared_prefix_groups",
           "prefix_forward", "segment", "pad_segments", "run_prefixes",
           "wanted_positions", "shareable_cache", "checked_unit_widths"]

# Slots that act on a position's logits only (after the last layer): no key or value depends on
# them, so two prefixes that differ only there are the same prefix.
OUTPUT_SLOTS: tuple[str, ...] = ("final_norm", "unembed")


@dataclass(frozen=True)
class GraftItem:
    """One row of a grafted forward pass: its tokens, its :class:`SourceMap` (one row: ``slots``
    ``[len(input_ids), n_slots]``, each unit map ``[len(input_ids), units]``) and the logits wanted."""

    input_ids: Sequence[int]  # the full sequence of one row
    maps: SourceMap  # what serves each position of the row
    logit_start: int = -1  # first position whose logits are wanted (negative: from the end)
    n_logits: int = 1  # logits at logit_start .. logit_start + n_logits - 1

    def unit_maps(self) -> dict[str, torch.Tensor]:
        """Head, neuron and expert maps together, by slot name (a slot has one kind of unit)."""
        return {**self.maps.heads, **self.maps.neurons, **self.maps.experts}

    def __len__(self) -> int:
        return len(self.input_ids)

    def first_logit(self) -> int:
        """The first wanted position as a non-negative index, checked against the length."""
        n = len(self.input_ids)
        start = self.logit_start + n if self.logit_start < 0 else self.logit_start
        if self.n_logits < 1 or start < 0 or start + self.n_logits > n:
            raise GraftArgumentError(
                f"logits at {self.logit_start} (+{self.n_logits}) do not fit a row of {n} tokens"
            )
        return start


@dataclass(frozen=True)
class PrefixGroup:
    """Items whose first ``length`` positions are identical: that prefix is computed once."""

    length: int
    members: tuple[int, ...]  # item indices, ascending


@dataclass(frozen=True)
class PrefixPlan:
    """How a batch of items is run: groups sharing a prefix, and items run whole."""

    groups: tuple[PrefixGroup, ...]
    unshared: tuple[int, ...]

    def group_of(self) -> dict[int, int]:
        """Item index -> index of its group, for the items that are in one."""
        return {i: g for g, group in enumerate(self.groups) for i in group.members}


# ---- grouping ---------------------------------------------------------------------------------


def _head_slot_names(items: Sequence[GraftItem]) -> list[str]:
    """Every slot that some item grafts head by head (or neuron by neuron), in a fixed order."""
    return sorted({name for item in items for name in item.unit_maps()})


def _head_widths(items: Sequence[GraftItem], names: Sequence[str]) -> dict[str, int]:
    widths: dict[str, int] = {}
    for item in items:
        for name, tensor in item.unit_maps().items():
            widths.setdefault(name, int(tensor.shape[-1]))
    return {name: widths[name] for name in names}


def _full_heads(
    item: GraftItem, widths: Mapping[str, int], slot_index: Mapping[str, int] | None
) -> dict[str, torch.Tensor]:
    """The item's head maps for every slot in ``widths``: a slot it does not map head by head
    is served whole by its ``source`` column, i.e. every head from that model. Without a slot
    index (grouping without the model) an absent slot is marked -1, which equals nothing."""
    n = len(item.input_ids)
    out: dict[str, torch.Tensor] = {}
    for name, width in widths.items():
        given = item.unit_maps().get(name)
        if given is not None:
            if tuple(given.shape) != (n, width):
                raise GraftArgumentError(
                    f"the unit map {name!r} of an item must be [len(input_ids), units] = "
                    f"{[n, width]}, got {list(given.shape)}"
                )
            out[name] = given.to(device="cpu", dtype=torch.long)
        elif slot_index is not None:
            column = item.maps.slots[:, slot_index[name]].to(device="cpu", dtype=torch.long)
            out[name] = column[:, None].expand(n, width)
        else:
            out[name] = torch.full((n, width), -1, dtype=torch.long)
    return out


def _position_keys(
    item: GraftItem, widths: Mapping[str, int], slot_index: Mapping[str, int] | None
) -> list[bytes]:
    """One hashable key per position: its token, source row (less the output-only slots, when
    the slot table is known) and (normalized) head rows."""
    ids = torch.as_tensor(list(item.input_ids), dtype=torch.long)
    source = item.maps.slots.to(device="cpu", dtype=torch.long)
    if source.dim() != 2 or source.shape[0] != len(ids):
        raise GraftArgumentError(
            f"an item's source must be [len(input_ids), n_slots] = [{len(ids)}, ...], "
            f"got {list(source.shape)}"
        )
    heads = _full_heads(item, widths, slot_index)
    if slot_index is not None:
        output = {slot_index[name] for name in OUTPUT_SLOTS if name in slot_index}
        source = source[:, [s for s in range(source.shape[1]) if s not in output]]
    rows = torch.cat([ids[:, None], source, *heads.values()], dim=1).numpy()
    return [row.tobytes() for row in rows]


def _trie_paths(keys: Sequence[list[bytes]]) -> list[list[int]]:
    """For each item, the trie node of each of its prefixes (``paths[i][d - 1]`` is the node of
    its first ``d`` positions): equal nodes mean equal prefixes."""
    nodes: dict[tuple[int, bytes], int] = {}
    paths = []
    for item_keys in keys:
        node, path = -1, []
        for key in item_keys:
            node = nodes.setdefault((node, key), len(nodes))
            path.append(node)
        paths.append(path)
    return paths


def shared_prefix_groups(
    items: Sequence[GraftItem], min_shared: int = 2, slot_names: Sequence[str] | None = None
) -> PrefixPlan:
    """Group items by the prefix they share.

    Item i's shared length L is the longest prefix (same tokens, same source rows, same head
    rows) it has in common with some other item that can use it too: L never reaches a position
    whose logits either item wants, so every wanted logit (and at least one position) stays in
    the suffix. Items with the same L and the same prefix form a group. Items with
    L < ``min_shared``, or alone in their group, run whole.

    ``slot_names`` (``slots(model)``) lets a slot absent from an item's unit maps equal a
    unit map filled with that slot's source column, and leaves the output-only slots
    (``final_norm``, ``unembed``) out of the comparison: a prefix's logits are never used, so
    e.g. the donor alone shares its prefix with "donor everywhere but the last token". Without
    it, such maps count as different.
    """
    widths = _head_widths(items, _head_slot_names(items))
    slot_index = {name: s for s, name in enumerate(slot_names)} if slot_names is not None else None
    caps = [item.first_logit() for item in items]
    paths = _trie_paths([_position_keys(item, widths, slot_index) for item in items])
    users: dict[int, int] = defaultdict(int)  # node -> items that may stop their prefix there
    for path, cap in zip(paths, caps):
        for node in path[:cap]:
            users[node] += 1
    by_prefix: dict[int, tuple[int, list[int]]] = {}  # prefix node -> (length, members)
    unshared: list[int] = []
    for i, (path, cap) in enumerate(zip(paths, caps)):
        length = next((d for d in range(cap, 0, -1) if users[path[d - 1]] >= 2), 0)
        if length < max(min_shared, 1):
            unshared.append(i)
        else:
            by_prefix.setdefault(path[length - 1], (length, []))[1].append(i)
    groups = [PrefixGroup(n, tuple(m)) for n, m in by_prefix.values() if len(m) > 1]
    unshared += [m[0] for _, m in by_prefix.values() if len(m) == 1]
    groups.sort(key=lambda g: g.members[0])
    return PrefixPlan(tuple(groups), tuple(sorted(unshared)))


# ---- batched forward passes -------------------------------------------------------------------


@dataclass
class Segment:
    """Positions [start, stop) of one item, head maps normalized to a common slot set."""

    input_ids: torch.Tensor  # [n]
    source: torch.Tensor  # [n, n_slots]
    heads: dict[str, torch.Tensor]  # name -> [n, heads]


@dataclass
class PaddedBatch:
    """Padded segments, ready for ``graft_forward``."""

    input_ids: torch.Tensor  # [batch, seq]
    mask: torch.Tensor  # [batch, seq]
    source: torch.Tensor  # [batch, seq, n_slots]
    heads: dict[str, torch.Tensor]  # name -> [batch, seq, heads]

    def source_map(self, model: nn.Module) -> SourceMap:
        """The batch's maps for ``graft_forward``: its unit maps sorted into heads and neurons
        by ``model``'s slot table."""
        return SourceMap.from_units(self.source, self.heads, model_slots(model))


def segment(
    item: GraftItem, start: int, stop: int, widths: Mapping[str, int], slot_index: Mapping[str, int]
) -> Segment:
    """Positions [start, stop) of ``item``, its unit maps filled out to every slot in ``widths``."""
    heads = _full_heads(item, widths, slot_index)
    return Segment(
        torch.as_tensor(list(item.input_ids[start:stop]), dtype=torch.long),
        item.maps.slots[start:stop].to(device="cpu", dtype=torch.long),
        {name: h[start:stop] for name, h in heads.items()},
    )


def pad_segments(segments: Sequence[Segment], pad_id: int, left: bool) -> PaddedBatch:
    """Stack segments, padding with ``pad_id`` served by the base (masked out anyway)."""
    seq = max(len(s.input_ids) for s in segments)
    n_slots = segments[0].source.shape[1]
    batch = len(segments)
    ids = torch.full((batch, seq), pad_id, dtype=torch.long)
    mask = torch.zeros(batch, seq, dtype=torch.long)
    source = torch.zeros(batch, seq, n_slots, dtype=torch.long)
    heads = {
        name: torch.zeros(batch, seq, h.shape[1], dtype=torch.long)
        for name, h in segments[0].heads.items()
    }
    for b, seg in enumerate(segments):
        n = len(seg.input_ids)
        span = slice(seq - n, seq) if left else slice(0, n)
        ids[b, span], mask[b, span], source[b, span] = seg.input_ids, 1, seg.source
        for name, h in seg.heads.items():
            heads[name][b, span] = h
    return PaddedBatch(ids, mask, source, heads)


def wanted_positions(items: Sequence[GraftItem], offsets: Sequence[int], k: int) -> torch.Tensor:
    """``[len(items), k]``: each item's wanted positions, shifted left by its offset (the prefix
    it skips), the last one repeated up to ``k``."""
    rows = []
    for item, offset in zip(items, offsets):
        first = item.first_logit() - offset
        wanted = list(range(first, first + item.n_logits))
        rows.append(wanted + wanted[-1:] * (k - len(wanted)))
    return torch.tensor(rows, dtype=torch.long)


def shareable_cache(model: nn.Module) -> DynamicCache | None:
    """An empty cache for ``model``, or None (with a warning) when its cache layers are of a
    kind whose rows prefix sharing has not been checked to select and extend exactly; full and
    sliding-window attention layers are (Gemma 2/3, Mistral: tests/engine/test_prefix.py)."""
    cache = DynamicCache(config=cast("PreTrainedModel", model).config)  # nn.Module's stubs type it ``Tensor | Module``
    known = (DynamicLayer, DynamicSlidingWindowLayer)
    other = sorted({type(x).__name__ for x in cache.layers if type(x) not in known})
    if not other:
        return cache
    warnings.warn(
        f"prefix sharing is not supported with {', '.join(other)} cache layers; "
        "running every item whole", stacklevel=3,
    )
    return None


def _run_whole(
    models: Sequence[nn.Module], items: Sequence[GraftItem], pad_id: int, k: int,
    widths: Mapping[str, int], slot_index: Mapping[str, int],
) -> torch.Tensor:
    """The plain path: items run whole, right-padded, in one ``graft_forward`` call."""
    batch = pad_segments([segment(it, 0, len(it), widths, slot_index) for it in items], pad_id, left=False)
    return graft_forward(
        models, batch.input_ids, batch.source_map(models[0]), attention_mask=batch.mask,
        logit_positions=wanted_positions(items, [0] * len(items), k),
    )


def run_prefixes(
    models: Sequence[nn.Module], items: Sequence[GraftItem], groups: Sequence[PrefixGroup],
    *, cache: DynamicCache, pad_id: int, widths: Mapping[str, int], slot_index: Mapping[str, int],
) -> torch.Tensor:
    """Fill ``cache`` with every group's prefix (one row per group, left-padded); returns the
    prefix attention mask ``[groups, prefix_len]``."""
    segments = [segment(items[g.members[0]], 0, g.length, widths, slot_index) for g in groups]
    batch = pad_segments(segments, pad_id, left=True)
    last = torch.full((len(groups), 1), batch.input_ids.shape[1] - 1, dtype=torch.long)
    graft_forward(
        models, batch.input_ids, batch.source_map(models[0]), attention_mask=batch.mask, logit_positions=last,
        past_key_values=cache,
    )
    return batch.mask


def _run_suffixes(
    models: Sequence[nn.Module], items: Sequence[GraftItem], plan: PrefixPlan, *, cache: DynamicCache,
    prefix_mask: torch.Tensor, pad_id: int, k: int, widths: Mapping[str, int],
    slot_index: Mapping[str, int],
) -> tuple[list[int], torch.Tensor]:
    """Every grouped item's positions after its prefix, on its group's cache row, in one call.
    Returns the item indices (ascending) and their logits."""
    group_of = plan.group_of()
    members = sorted(group_of)
    lengths = [plan.groups[group_of[i]].length for i in members]
    rows = torch.tensor([group_of[i] for i in members], dtype=torch.long)
    cache.batch_select_indices(rows)  # CPU indices serve cache layers on any device (device_map)
    segments = [segment(items[i], n, len(items[i]), widths, slot_index) for i, n in zip(members, lengths)]
    batch = pad_segments(segments, pad_id, left=False)
    logits = graft_forward(
        models, batch.input_ids, batch.source_map(models[0]),
        attention_mask=torch.cat([prefix_mask[rows], batch.mask], dim=1),
        logit_positions=wanted_positions([items[i] for i in members], lengths, k),
        past_key_values=cache,
    )
    return members, logits


def checked_unit_widths(
    items: Sequence[GraftItem], slot_list: Sequence[Slot], slot_index: Mapping[str, int]
) -> dict[str, int]:
    """Units per unit-mapped slot, from the slot table; names that cannot be so mapped are
    refused here, before padding would fail on them less clearly."""
    widths = {}
    for item in items:
        kinds: tuple[tuple[Mapping[str, torch.Tensor], UnitKind | None], ...] = (
            (item.maps.heads, Units.HEAD), (item.maps.neurons, Units.NEURON), (item.maps.experts, None))
        for units, kind in kinds:
            widths.update({name: _unit_width(name, kind, slot_list, slot_index) for name in units})
    return {name: widths[name] for name in sorted(widths)}


def _unit_width(name: str, kind: UnitKind | None, slot_list: Sequence[Slot], slot_index: Mapping[str, int]) -> int:
    """The units of slot ``name`` mapped per ``kind`` (None: expert by expert), or the refusal;
    an expert bank's map may ride with the heads or neurons (a compiled scheme's experts rule)."""
    what = kind or "expert"
    if name not in slot_index:
        raise GraftArgumentError(f"{what}_source names {name!r}, which is not a slot of this model")
    slot = slot_list[slot_index[name]]
    width = slot.experts or (slot.units(kind) if kind is not None else 0)
    if not width:
        which = "an expert bank" if kind is None else "q, k, v and o" if kind == Units.HEAD else "gate, up and down"
        raise GraftArgumentError(f"slot {name!r} cannot be grafted per {what}; only {which} can")
    return width


@torch.no_grad()
def prefix_forward(
    models: Sequence[nn.Module], items: Sequence[GraftItem], pad_id: int, min_shared: int = 2,
    share: bool = True,
) -> torch.Tensor:
    """``[len(items), max n_logits, vocab]`` logits, the same as running each item whole with
    ``graft_forward``, but with prefixes shared by several items computed once (see
    ``shared_prefix_groups``). Rows wanting fewer logits are padded by repeating the last wanted
    position's logits. Runs without gradients: it is for evaluation sweeps, and the cache would
    otherwise hold every prefix's graph.

    Models whose KV cache has layers of other kinds than full or sliding-window attention run
    every item whole (still one batched call), as do all items with ``share=False``, and all
    items of half-precision models: where a row is split into prefix and suffix depends on
    which rows share its batch, and in bfloat16 the split alone moves its numbers (a probability
    0.00793 became 0.00796 on a tiny llama), so half-precision rows run whole in any batch.
    """
    if not items:
        raise GraftArgumentError("prefix_forward needs at least one item")
    share = share and not is_half(models[0])
    slot_list = model_slots(models[0])
    names = [s.name for s in slot_list]
    slot_index = {name: s for s, name in enumerate(names)}
    widths = checked_unit_widths(items, slot_list, slot_index)
    k = max(item.n_logits for item in items)
    cache = shareable_cache(models[0]) if share else None
    plan = (
        shared_prefix_groups(items, min_shared, names) if cache is not None
        else PrefixPlan((), tuple(range(len(items))))
    )
    parts: list[tuple[Sequence[int], torch.Tensor]] = []
    if plan.groups:
        assert cache is not None  # groups are planned only with a cache
        prefix_mask = run_prefixes(models, items, plan.groups, cache=cache, pad_id=pad_id, widths=widths, slot_index=slot_index)
        parts.append(_run_suffixes(models, items, plan, cache=cache, prefix_mask=prefix_mask, pad_id=pad_id, k=k, widths=widths, slot_index=slot_index))
    if plan.unshared:
        chosen = [items[i] for i in plan.unshared]
        parts.append((plan.unshared, _run_whole(models, chosen, pad_id, k, widths, slot_index)))
    first = parts[0][1]
    out = first.new_empty(len(items), k, first.shape[-1])
    for index, logits in parts:
        out[torch.as_tensor(index, dtype=torch.long, device=out.device)] = logits
    return out
