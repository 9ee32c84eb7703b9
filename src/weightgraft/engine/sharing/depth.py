"""Depth sharing: an item that differs from a reference row only from position p and layer l
on runs only layers l.. at positions p.. .

A grafted row whose source map equals a reference row's at every position before p, and in
every slot below layer l at every position (the embedding counts as layer -1), has the
reference's keys and values at positions < p and enters layer l at positions >= p with the
reference's residual stream. The reference is the base (every exact cell and set is the base
but for its cells), or a row given by the caller: in a refinement round every "set without
cell c" is the whole set but for c. Per reference, its residual stream entering each layer is
computed once (one pass over every reference), its prefix [0, p) once per (reference, p) per
pass into a ``DynamicCache``, and each item then runs its positions p.. with the layers below
l skipped and the reference's residual put in at layer l. The logits equal those of
``graft_forward`` on the whole row (tests/engine/test_depth.py holds every architecture to it in
float64).

Rows are batched by their remaining work (positions x layers), so that a pass is not padded
to its longest row: a pass runs from its rows' lowest first layer, over its longest suffix.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from weightgraft.engine.architectures import adapter_for, model_slots
from weightgraft.engine.forward import graft_forward
from weightgraft.engine.precision import is_half
from weightgraft.engine.sharing.prefix import (
    GraftItem,
    Segment,
    checked_unit_widths,
    pad_segments,
    prefix_forward,
    segment,
    shareable_cache,
    wanted_positions,
)
from weightgraft.engine.source_map import SlotName, SourceMap
from weightgraft.engine.swaps import own_forward, swaps
from weightgraft.errors import GraftArgumentError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = ["DepthStart", "DepthStats", "depth_start", "differs", "item_starts", "slot_layers", "cost_batches",
           "depth_forward", "Reduce", "UNIT_BUDGET",
           "ReferenceStates", "run_pass", "decoder_blocks"]

Reduce = Callable[[torch.Tensor, list[int]], torch.Tensor]  # (a pass's logits, its item indices) -> kept rows
UNIT_BUDGET = 1 << 24  # unit-map entries per pass (int64: 128 MiB)
SLACK = 1.25  # a pass is cut when its padded work would pass this multiple of its rows' own work
MIN_ROWS = 16  # ... unless it holds fewer rows than this (a pass has a fixed cost of its own)


@dataclass(frozen=True)
class DepthStart:
    """Where an item first differs from the base: its first position and first decoder layer
    (-1: the embedding is grafted, so it runs from its input)."""

    position: int
    layer: int
    reference: int = 0  # the row it shares with: an index into ``depth_forward``'s references


@dataclass
class DepthStats:
    """What ``depth_forward`` held and ran: peak bytes of the shared states (the reference
    rows' residual streams and keys/values, a pass's cache rows and the residuals put in), and
    its passes."""

    peak_bytes: int = 0
    reference_bytes: int = 0
    passes: int = 0
    rows: int = 0
    pass_sizes: list[int] = field(default_factory=list)


def slot_layers(model: nn.Module) -> list[int]:
    """Per slot of ``model``, the decoder layer it acts in: -1 for ``embed`` / ``pos_embed``,
    the number of layers for ``final_norm`` / ``unembed``."""
    n_layers = len(decoder_blocks(model))
    out = []
    for s in model_slots(model):
        layer = SlotName.parse(s.name).layer
        if layer is not None:
            out.append(layer)
        elif s.name in ("embed", "pos_embed"):
            out.append(-1)
        else:
            out.append(n_layers)
    return out


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's decoder blocks, where its architecture adapter says they are."""
    blocks = model.get_submodule(adapter_for(model.config).layers)
    assert isinstance(blocks, nn.ModuleList)  # every adapter's decoder blocks are one
    return blocks


def differs(item: Segment, reference: Segment, slot_index: Mapping[str, int]) -> torch.Tensor:
    """``[len(item), n_slots]`` bool: where a row's model (of the whole slot, its rest or some
    unit) is not its reference's, both given whole (``segment``), their unit maps filled out
    to the same slots (a slot without one is its source column for every unit)."""
    if not torch.equal(item.input_ids, reference.input_ids):
        raise ValueError("an item can share depth only with a reference row of the same tokens")
    out = item.source != reference.source
    for name, maps in item.heads.items():
        out[:, slot_index[name]] |= (maps != reference.heads[name]).any(dim=1)
    return out


def depth_start(differ: torch.Tensor, first_logit: int, layers: Sequence[int], n_layers: int,
                reference: int = 0) -> DepthStart:
    """Where a row first differs from its reference (``differ``, see ``differs``): the first
    position (at most its first wanted logit) and the first layer over all positions (the last
    layer when only ``final_norm`` / ``unembed`` or nothing differs: that layer then runs at the
    wanted positions alone)."""
    rows = differ.any(dim=1).nonzero().flatten()
    position = min(int(rows[0]), first_logit) if rows.numel() else first_logit
    cols = differ.any(dim=0).nonzero().flatten().tolist()
    layer = min((layers[s] for s in cols), default=n_layers)
    return DepthStart(position, min(layer, n_layers - 1), reference)


def _work(item: GraftItem, start: DepthStart, n_layers: int) -> tuple[int, int]:
    """(positions, layers) an item runs."""
    return len(item) - start.position, n_layers - max(start.layer, 0)


def cost_batches(
    items: Sequence[GraftItem], starts: Sequence[DepthStart], n_layers: int, chunk: int,
    unit_budget: int = UNIT_BUDGET,
) -> list[list[int]]:
    """Item indices in passes: ordered by remaining positions, then layers, then the slots
    mapped unit by unit, and cut where a pass would hold ``chunk`` rows, its padded unit maps
    would pass ``unit_budget`` entries, or its padded work (rows x longest suffix x layers from
    its lowest first layer) would pass ``SLACK`` times its rows' own work. Rows starting at
    position 0 (no cache to share) never share a pass with rows that start later."""
    work = [_work(item, s, n_layers) for item, s in zip(items, starts)]

    def key(i: int) -> tuple[bool, int, int, tuple[str, ...], int]:
        units = items[i].unit_maps()
        return (starts[i].position == 0, work[i][0], work[i][1], tuple(sorted(units)), i)

    out: list[list[int]] = []
    current: list[int] = []
    widths: dict[str, int] = {}
    real = longest = deepest = 0
    for i in sorted(range(len(items)), key=key):
        item_widths = {n: int(m.shape[1]) for n, m in items[i].unit_maps().items()}
        grown = {**widths, **item_widths}
        positions, layers = work[i]
        rows = len(current) + 1
        padded = rows * max(longest, positions) * max(deepest, layers)
        units = rows * max(longest, positions) * sum(grown.values())
        cut = current and (
            len(current) >= chunk or units > unit_budget
            or (starts[current[0]].position == 0) != (starts[i].position == 0)
            or (len(current) >= MIN_ROWS and padded > SLACK * (real + positions * layers))
        )
        if cut:
            out.append(current)
            current, real, longest, deepest, grown = [], 0, 0, 0, dict(item_widths)
        current.append(i)
        widths, real = grown, real + positions * layers
        longest, deepest = max(longest, positions), max(deepest, layers)
    if current:
        out.append(current)
    return out


def _layer_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    hidden: torch.Tensor = args[0] if args else kwargs["hidden_states"]
    return hidden


def cache_states(cache: DynamicCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, the keys and values of a cache of full layers (``DynamicCache()``) a pass filled."""
    keys, values = [], []
    for layer in cache.layers:
        assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
        keys.append(layer.keys)
        values.append(layer.values)
    return keys, values


@dataclass
class ReferenceStates:
    """What items share with their reference rows: each used reference's residual stream
    entering the layers items start at, and its keys and values at every layer."""

    residuals: dict[int, dict[int, torch.Tensor]]  # reference -> layer -> [len(row), hidden]
    keys: list[torch.Tensor]  # per layer: [used references, kv heads, longest row, head dim]
    values: list[torch.Tensor]
    row_of: dict[int, int]  # reference -> its row in ``keys`` / ``values``

    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, *(t for per in self.residuals.values() for t in per.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    def cache(self, config: PretrainedConfig, starts: Sequence[DepthStart]) -> tuple[DynamicCache, torch.Tensor]:
        """A ``DynamicCache`` whose row b holds the keys and values of positions
        ``[0, starts[b].position)`` of its reference, left-padded to the longest, and the
        attention mask of those cached positions."""
        lengths = torch.tensor([s.position for s in starts])
        longest = int(lengths.max())
        rows = torch.tensor([self.row_of[s.reference] for s in starts])
        positions = torch.arange(longest)[None, :] - (longest - lengths[:, None])  # [rows, longest]
        mask = (positions >= 0).long()
        index = positions.clamp(min=0)

        def take(states: torch.Tensor) -> torch.Tensor:
            picked = states[rows.to(states.device)]  # [rows, heads, n, dim]
            if bool(mask.all()):  # every row starts at the same position: no padding to put in
                return picked[:, :, :longest]
            where = index.to(states.device)[:, None, :, None].expand(-1, picked.shape[1], -1, picked.shape[-1])
            return picked.gather(2, where) * mask.to(states.device)[:, None, :, None].to(states.dtype)

        data = [(take(k), take(v)) for k, v in zip(self.keys, self.values)]
        return DynamicCache(ddp_cache_data=data, config=config), mask


def _reference_states(
    models: Sequence[nn.Module], references: Sequence[GraftItem], starts: Sequence[DepthStart],
    *, pad_id: int, blocks: nn.ModuleList, widths: Mapping[str, int], slot_index: Mapping[str, int],
) -> ReferenceStates:
    """One pass over every reference some item starts from: its residual stream entering the
    layers items start at, and its keys and values (a cache of full layers: a sliding-window
    layer's cache keeps only its window, and items need any prefix of the row)."""
    wanted: dict[int, set[int]] = {s.reference: set() for s in starts}
    for s in starts:
        if s.layer >= 0:
            wanted[s.reference].add(s.layer)
    used = sorted(wanted)
    seen: dict[int, torch.Tensor] = {}

    def keep(j: int, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen[j] = _layer_input(args, kwargs)

    layers = sorted(set().union(*wanted.values()))
    cache = DynamicCache()  # full layers only
    with swaps() as made:  # the hooks come off however the pass ends
        for j in layers:
            made.hook(blocks[j], functools.partial(keep, j), pre=True, with_kwargs=True)
        batch = pad_segments([segment(references[r], 0, len(references[r]), widths, slot_index) for r in used],
                             pad_id, left=False)
        graft_forward(models, batch.input_ids, batch.source_map(models[0]), attention_mask=batch.mask,
                      logit_positions=torch.zeros(len(used), 1, dtype=torch.long), past_key_values=cache)
    residuals = {r: {j: seen[j][b, : len(references[r])] for j in sorted(wanted[r])} for b, r in enumerate(used)}
    keys, values = cache_states(cache)
    return ReferenceStates(residuals, keys, values, {r: b for b, r in enumerate(used)})


def _skipped(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _layer_input(args, kwargs)


def _entering(own: Callable[..., Any], rows: torch.Tensor, residual: torch.Tensor) -> Callable[..., Any]:
    """A block forward that first replaces the input of ``rows`` by ``residual``."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        hidden = _layer_input(args, kwargs)
        keep = rows.to(hidden.device)[:, None, None]
        hidden = torch.where(keep, residual.to(device=hidden.device, dtype=hidden.dtype), hidden)
        if args:
            return own(hidden, *args[1:], **kwargs)
        return own(**{**kwargs, "hidden_states": hidden})

    return forward


@contextlib.contextmanager
def _from_layers(blocks: nn.ModuleList, first: int, row_layers: torch.Tensor, residual: torch.Tensor) -> Iterator[None]:
    """Within it, blocks below ``first`` pass their input through untouched, and block j puts
    ``residual`` in for the rows that start at j; every forward is restored on exit."""
    with swaps() as made:
        for j, block in enumerate(blocks):
            rows = row_layers == j
            if j < first:
                made.forward(block, _skipped)
            elif bool(rows.any()):
                made.forward(block, _entering(own_forward(block), rows, residual))
        yield


def _cache_bytes(cache: DynamicCache | None) -> int:
    if cache is None:
        return 0
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def run_pass(
    models: Sequence[nn.Module], items: Sequence[GraftItem], starts: Sequence[DepthStart],
    *, states: ReferenceStates, blocks: nn.ModuleList, pad_id: int, k: int, widths: Mapping[str, int],
    slot_index: Mapping[str, int], stats: DepthStats,
) -> torch.Tensor:
    """One pass: every row's positions from its first one, from its first layer, on a cache of
    its reference's keys and values before that position."""
    cache, attention_prefix = None, None
    if starts[0].position > 0:
        # nn.Module's stubs type a model's config as ``Tensor | Module``
        cache, attention_prefix = states.cache(cast("PreTrainedModel", models[0]).config, starts)
    segments = [segment(item, s.position, len(item), widths, slot_index) for item, s in zip(items, starts)]
    batch = pad_segments(segments, pad_id, left=False)
    row_layers = torch.tensor([s.layer for s in starts], dtype=torch.long)
    first = max(int(row_layers.min()), 0)
    residual = None
    for b, s in enumerate(starts):
        if s.layer < 0:
            continue
        entering = states.residuals[s.reference][s.layer][s.position :]
        if residual is None:
            residual = entering.new_zeros(*batch.input_ids.shape, entering.shape[-1])
        residual[b, : entering.shape[0]] = entering
    mask = batch.mask if attention_prefix is None else torch.cat([attention_prefix, batch.mask], dim=1)
    before = _cache_bytes(cache)
    with contextlib.ExitStack() as stack:
        if residual is not None:
            stack.enter_context(_from_layers(blocks, first, row_layers, residual))
        logits = graft_forward(
            models, batch.input_ids, batch.source_map(models[0]), attention_mask=mask,
            logit_positions=wanted_positions(items, [s.position for s in starts], k),
            past_key_values=cache,
        )
    held = max(before, _cache_bytes(cache))  # a layer's update replaces its rows by longer ones
    held += residual.numel() * residual.element_size() if residual is not None else 0
    stats.peak_bytes = max(stats.peak_bytes, stats.reference_bytes + held)
    stats.passes += 1
    stats.rows += len(items)
    stats.pass_sizes.append(len(items))
    return logits


def _starts(
    items: Sequence[GraftItem], references: Sequence[GraftItem], layers: Sequence[int], n_layers: int,
    widths: Mapping[str, int], slot_index: Mapping[str, int],
) -> tuple[list[GraftItem], list[DepthStart]]:
    """Every reference row (the base of each item's tokens first, then ``references``) and,
    per item, its start from the reference that leaves it the least work."""
    rows: list[GraftItem] = []
    by_tokens: dict[tuple[int, ...], list[int]] = {}
    for item in items:
        tokens = tuple(item.input_ids)
        if tokens not in by_tokens:
            by_tokens[tokens] = [len(rows)]
            rows.append(GraftItem(tokens, SourceMap(torch.zeros_like(item.maps.slots, device="cpu"))))
    for ref in references:
        tokens = tuple(ref.input_ids)
        if tokens in by_tokens:
            by_tokens[tokens].append(len(rows))
            rows.append(ref)
    whole = [segment(row, 0, len(row), widths, slot_index) for row in rows]
    starts = []
    for item in items:
        mine = segment(item, 0, len(item), widths, slot_index)
        options = [depth_start(differs(mine, whole[r], slot_index), item.first_logit(), layers, n_layers, r)
                   for r in by_tokens[tuple(item.input_ids)]]
        starts.append(min(options, key=lambda s: (_cost(item, s, n_layers), s.reference)))
    return rows, starts


def item_starts(
    model: nn.Module, items: Sequence[GraftItem], references: Sequence[GraftItem] = ()
) -> list[DepthStart]:
    """Each item's start (see ``depth_forward``): reference 0.. are the base of each distinct
    token row in order of first use, then ``references`` of those tokens."""
    slot_list = model_slots(model)
    slot_index = {s.name: i for i, s in enumerate(slot_list)}
    widths = checked_unit_widths([*items, *references], slot_list, slot_index)
    return _starts(items, references, slot_layers(model), len(decoder_blocks(model)), widths, slot_index)[1]


def _cost(item: GraftItem, start: DepthStart, n_layers: int) -> int:
    positions, layers = _work(item, start, n_layers)
    return positions * layers


@torch.no_grad()
def depth_forward(
    models: Sequence[nn.Module], items: Sequence[GraftItem], pad_id: int, *, chunk: int = 512,
    unit_budget: int = UNIT_BUDGET, stats: DepthStats | None = None,
    references: Sequence[GraftItem] = (), reduce: Reduce | None = None,
) -> torch.Tensor:
    """``[len(items), max n_logits, vocab]`` logits, the same as ``graft_forward`` of each item
    whole, each item run only from where it first differs from the base or from one of
    ``references`` (rows of the same tokens; see the module's docstring), whichever leaves it
    less work. Rows wanting fewer logits repeat the last wanted one. ``stats`` (if given)
    records the passes and the peak bytes of the shared states. ``reduce(logits, rows)`` (if
    given) turns each pass's logits of items ``rows`` into what is kept of them (e.g. a metric
    per row), so that a call of many items never holds all their logits at once.

    Half-precision models, and models whose cache has layers of kinds other than full or
    sliding-window attention, run through ``prefix_forward`` instead (which runs their rows
    whole: see there why).
    """
    if not items:
        raise GraftArgumentError("depth_forward needs at least one item")
    if is_half(models[0]) or shareable_cache(models[0]) is None:
        logits = prefix_forward(models, items, pad_id)
        return logits if reduce is None else reduce(logits, list(range(len(items))))
    stats = stats if stats is not None else DepthStats()
    slot_list = model_slots(models[0])
    slot_index = {s.name: i for i, s in enumerate(slot_list)}
    widths = checked_unit_widths([*items, *references], slot_list, slot_index)
    blocks = decoder_blocks(models[0])
    layers, n_layers = slot_layers(models[0]), len(blocks)
    rows, starts = _starts(items, references, layers, n_layers, widths, slot_index)
    states = _reference_states(models, rows, starts, pad_id=pad_id, blocks=blocks, widths=widths, slot_index=slot_index)
    stats.reference_bytes = states.nbytes()
    k = max(item.n_logits for item in items)
    out = None
    for chosen in cost_batches(items, starts, n_layers, chunk, unit_budget):
        part = run_pass(models, [items[i] for i in chosen], [starts[i] for i in chosen], states=states, blocks=blocks,
                         pad_id=pad_id, k=k, widths=widths, slot_index=slot_index, stats=stats)
        part = part if reduce is None else reduce(part, chosen)
        if out is None:
            out = part.new_empty(len(items), *part.shape[1:])
        out[torch.as_tensor(chosen, dtype=torch.long, device=out.device)] = part
    assert out is not None  # items make at least one pass
    return out
