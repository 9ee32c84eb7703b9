"""Depth sharing: an item that differs from the base only from position p and layer l on runs
only layers l.. at positions p.. .

A grafted row whose source map is the base's at every position before p, and in every slot
below layer l at every position (the embedding counts as layer -1), computes the base's keys
and values at positions < p, and enters layer l at positions >= p with the base's residual
stream. Both are shared by all such rows of an example: the base's residual stream entering
each layer is computed once per example (one plain pass), the base's prefix [0, p) once per
(example, p) per pass into a ``DynamicCache``, and each row then runs its positions p.. with
the layers below l skipped and the base's residual put in at layer l. The logits equal those
of ``graft_forward`` on the whole row (tests/test_depth.py holds every architecture to it in
float64).

Rows are batched by their remaining work (positions x layers), so that a pass is not padded
to its longest row: a pass runs from its rows' lowest first layer, over its longest suffix.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache

from weightgraft.engine.architectures import adapter_for, model_slots
from weightgraft.engine.forward import graft_forward
from weightgraft.engine.precision import is_half
from weightgraft.engine.prefix import (
    GraftItem,
    PrefixGroup,
    checked_unit_widths,
    pad_segments,
    prefix_forward,
    run_prefixes,
    segment,
    shareable_cache,
    split_units,
    wanted_positions,
)

__all__ = ["DepthStart", "DepthStats", "depth_start", "slot_layers", "cost_batches", "depth_forward",
           "depth_state_bytes", "UNIT_BUDGET"]

UNIT_BUDGET = 1 << 24  # unit-map entries per pass (int64: 128 MiB)
SLACK = 1.25  # a pass is cut when its padded work would pass this multiple of its rows' own work
MIN_ROWS = 16  # ... unless it holds fewer rows than this (a pass has a fixed cost of its own)


@dataclass(frozen=True)
class DepthStart:
    """Where an item first differs from the base: its first position and first decoder layer
    (-1: the embedding is grafted, so it runs from its input)."""

    position: int
    layer: int


@dataclass
class DepthStats:
    """What ``depth_forward`` held and ran: peak bytes of the shared states (the base's
    residual streams, the key/value cache rows and the residuals put in), and its passes."""

    peak_bytes: int = 0
    residual_bytes: int = 0
    passes: int = 0
    rows: int = 0
    pass_sizes: list[int] = field(default_factory=list)


def slot_layers(model: nn.Module) -> list[int]:
    """Per slot of ``model``, the decoder layer it acts in: -1 for ``embed`` / ``pos_embed``,
    the number of layers for ``final_norm`` / ``unembed``."""
    n_layers = len(_blocks(model))
    out = []
    for s in model_slots(model):
        if s.name.startswith("layers."):
            out.append(int(s.name.split(".")[1]))
        elif s.name in ("embed", "pos_embed"):
            out.append(-1)
        else:
            out.append(n_layers)
    return out


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The model's decoder blocks, where its architecture adapter says they are."""
    return model.get_submodule(adapter_for(model.config).layers)


def _grafted(item: GraftItem, slot_index: Mapping[str, int]) -> torch.Tensor:
    """``[len(item), n_slots]`` bool: where some unit or the whole slot is not the base's."""
    grafted = item.source.to(device="cpu") != 0
    for name, maps in item.unit_maps().items():
        grafted[:, slot_index[name]] |= (maps.to(device="cpu") != 0).any(dim=1)
    return grafted


def depth_start(
    item: GraftItem, layers: Sequence[int], n_layers: int, slot_index: Mapping[str, int]
) -> DepthStart:
    """The item's first grafted position (at most its first wanted logit) and its first grafted
    layer over all positions (the last layer when only ``final_norm`` / ``unembed`` or nothing
    is grafted: that layer then runs at the wanted positions alone)."""
    grafted = _grafted(item, slot_index)
    rows = grafted.any(dim=1).nonzero().flatten()
    first_logit = item.first_logit()
    position = min(int(rows[0]), first_logit) if rows.numel() else first_logit
    cols = grafted.any(dim=0).nonzero().flatten().tolist()
    layer = min((layers[s] for s in cols), default=n_layers)
    return DepthStart(position, min(layer, n_layers - 1))


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

    def key(i: int) -> tuple:
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


def _layer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _base_residuals(
    base: nn.Module, items: Sequence[GraftItem], starts: Sequence[DepthStart], pad_id: int,
    blocks: nn.ModuleList,
) -> dict[tuple[int, ...], dict[int, torch.Tensor]]:
    """tokens -> {layer: the base's residual stream entering it, ``[len(tokens), hidden]``}, for
    the layers some item of those tokens starts at: one plain base pass over every example."""
    wanted: dict[tuple[int, ...], set[int]] = {}
    for item, s in zip(items, starts):
        if s.layer >= 0:
            wanted.setdefault(tuple(item.input_ids), set()).add(s.layer)
    if not wanted:
        return {}
    examples = list(wanted)
    layers = sorted(set().union(*wanted.values()))
    seen: dict[int, torch.Tensor] = {}
    handles = [
        blocks[j].register_forward_pre_hook(
            functools.partial(lambda j, _m, args, kwargs: seen.__setitem__(j, _layer_input(args, kwargs)), j),
            with_kwargs=True,
        )
        for j in layers
    ]
    n = max(len(t) for t in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, tokens in enumerate(examples):
        ids[b, : len(tokens)] = torch.tensor(tokens)
        mask[b, : len(tokens)] = 1
    n_slots = len(model_slots(base))
    try:
        graft_forward([base], ids, torch.zeros(*ids.shape, n_slots, dtype=torch.long), attention_mask=mask,
                      logit_positions=torch.zeros(len(examples), 1, dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return {
        tokens: {j: seen[j][b, : len(tokens)] for j in sorted(wanted[tokens])}
        for b, tokens in enumerate(examples)
    }


def _own_forward(module: nn.Module):
    """The module's forward as it is now (an instance-level one, e.g. accelerate's, or the class's)."""
    own = module.__dict__.get("forward")
    return own if own is not None else functools.partial(type(module).forward, module)


def _skipped(*args, **kwargs) -> torch.Tensor:
    return _layer_input(args, kwargs)


def _entering(own, rows: torch.Tensor, residual: torch.Tensor):
    """A block forward that first replaces the input of ``rows`` by ``residual``."""

    def forward(*args, **kwargs):
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
    patched: list[tuple[nn.Module, object]] = []
    try:
        for j, block in enumerate(blocks):
            rows = row_layers == j
            if j >= first and not bool(rows.any()):
                continue
            fn = _skipped if j < first else _entering(_own_forward(block), rows, residual)
            patched.append((block, block.__dict__.get("forward")))
            block.forward = fn
        yield
    finally:
        for block, own in reversed(patched):
            if own is None:
                del block.forward
            else:
                block.forward = own


def _cache_bytes(cache: DynamicCache | None) -> int:
    if cache is None:
        return 0
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def _run_pass(
    models: Sequence[nn.Module], items: Sequence[GraftItem], starts: Sequence[DepthStart],
    residuals: Mapping[tuple[int, ...], Mapping[int, torch.Tensor]], blocks: nn.ModuleList,
    pad_id: int, k: int, widths: Mapping[str, int], slot_index: Mapping[str, int], stats: DepthStats,
) -> torch.Tensor:
    """One pass: the base prefixes of its (example, first position) groups into a cache, then
    every row's positions from its first one, from its first layer."""
    cache, attention_prefix = None, None
    if starts[0].position > 0:
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (item, s) in enumerate(zip(items, starts)):
            groups.setdefault(tuple(item.input_ids[: s.position]), []).append(i)
        prefix_groups = [PrefixGroup(len(key), tuple(m)) for key, m in groups.items()]
        cache = shareable_cache(models[0])
        prefix_mask = run_prefixes(models, items, prefix_groups, cache, pad_id, widths, slot_index)
        row_of = {i: g for g, members in enumerate(groups.values()) for i in members}
        rows = torch.tensor([row_of[i] for i in range(len(items))], dtype=torch.long)
        cache.batch_select_indices(rows)
        attention_prefix = prefix_mask[rows]
    segments = [segment(item, s.position, len(item), widths, slot_index) for item, s in zip(items, starts)]
    batch = pad_segments(segments, pad_id, left=False)
    row_layers = torch.tensor([s.layer for s in starts], dtype=torch.long)
    first = max(int(row_layers.min()), 0)
    residual = None
    for b, (item, s) in enumerate(zip(items, starts)):
        if s.layer < 0:
            continue
        entering = residuals[tuple(item.input_ids)][s.layer][s.position :]
        if residual is None:
            residual = entering.new_zeros(*batch.input_ids.shape, entering.shape[-1])
        residual[b, : entering.shape[0]] = entering
    mask = batch.mask if attention_prefix is None else torch.cat([attention_prefix, batch.mask], dim=1)
    heads, neurons = split_units(batch.heads)
    with contextlib.ExitStack() as stack:
        if residual is not None:
            stack.enter_context(_from_layers(blocks, first, row_layers, residual))
        logits = graft_forward(
            models, batch.input_ids, batch.source, attention_mask=mask,
            logit_positions=wanted_positions(items, [s.position for s in starts], k),
            head_source=heads, past_key_values=cache, neuron_source=neurons,
        )
    held = _cache_bytes(cache) + (residual.numel() * residual.element_size() if residual is not None else 0)
    stats.peak_bytes = max(stats.peak_bytes, stats.residual_bytes + held)
    stats.passes += 1
    stats.rows += len(items)
    stats.pass_sizes.append(len(items))
    return logits


@torch.no_grad()
def depth_forward(
    models: Sequence[nn.Module], items: Sequence[GraftItem], pad_id: int, chunk: int = 512,
    unit_budget: int = UNIT_BUDGET, stats: DepthStats | None = None,
) -> torch.Tensor:
    """``[len(items), max n_logits, vocab]`` logits, the same as ``graft_forward`` of each item
    whole, each item run only from its ``depth_start`` (see the module's docstring). Rows
    wanting fewer logits repeat the last wanted one. ``stats`` (if given) records the passes
    and the peak bytes of the shared states.

    Half-precision models, and models whose cache has layers of kinds other than full or
    sliding-window attention, run through ``prefix_forward`` instead (which runs their rows
    whole: see there why).
    """
    if not items:
        raise ValueError("depth_forward needs at least one item")
    if is_half(models[0]) or shareable_cache(models[0]) is None:
        return prefix_forward(models, items, pad_id)
    stats = stats if stats is not None else DepthStats()
    slot_list = model_slots(models[0])
    slot_index = {s.name: i for i, s in enumerate(slot_list)}
    widths = checked_unit_widths(items, slot_list, slot_index)
    blocks = _blocks(models[0])
    layers, n_layers = slot_layers(models[0]), len(blocks)
    starts = [depth_start(item, layers, n_layers, slot_index) for item in items]
    residuals = _base_residuals(models[0], items, starts, pad_id, blocks)
    stats.residual_bytes = sum(t.numel() * t.element_size() for per in residuals.values() for t in per.values())
    k = max(item.n_logits for item in items)
    out = None
    for rows in cost_batches(items, starts, n_layers, chunk, unit_budget):
        part = _run_pass(models, [items[i] for i in rows], [starts[i] for i in rows], residuals, blocks,
                         pad_id, k, widths, slot_index, stats)
        if out is None:
            out = part.new_empty(len(items), k, part.shape[-1])
        out[torch.as_tensor(rows, dtype=torch.long, device=out.device)] = part
    return out


def depth_state_bytes(config: object, n_examples: int, seq_len: int, chunk: int, dtype_bytes: int = 4) -> int:
    """Upper bound on the bytes ``depth_forward`` holds in shared states, for ``n_examples``
    prompts of at most ``seq_len`` tokens in passes of ``chunk`` rows: the base's residual
    stream entering every layer of every prompt, and per pass the cache rows (keys and values
    of every layer at every position) and the residuals put in."""
    layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer"))
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd"))
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    residuals = n_examples * layers * seq_len * hidden
    cache = chunk * layers * 2 * seq_len * kv_heads * head_dim
    entering = chunk * seq_len * hidden
    return dtype_bytes * (residuals + cache + entering)
