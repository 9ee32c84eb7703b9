"""The null sets of one claim on one prompt: what the region must beat across prompts
(``regions.NULL_KINDS``). Every draw is reproducible from its seed string; where a kind has
no more distinct sets than the draws asked for, every set is taken (no repeats)."""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from weightgraft.engine.source_map import SlotName
from weightgraft.localization.maps import slot_parts
from weightgraft.localization.verify import CellKey


@dataclass(frozen=True)
class NullSets:
    """One prompt's null sets of one kind, the keys a draw could not place (``n_unmatched``: a
    slot the drawn position lacks, such as the unembedding away from the last token), or why no
    set of this kind exists (``missing``)."""

    sets: list[list[CellKey]]
    n_unmatched: int = 0
    missing: str = ""
    param_ratio: float = 1.0  # the sets' parameters over the region's (component nulls matched on parameters)


def _choices(pool: Sequence, size: int, draws: int, seed: str) -> list[tuple]:
    """``draws`` distinct subsets of ``size`` from ``pool`` (every one where there are no more)."""
    pool = sorted(pool)
    if math.comb(len(pool), size) <= draws:
        return list(itertools.combinations(pool, size))
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < draws:
        pick = tuple(sorted(rng.sample(pool, size)))
        if pick not in seen:
            seen.add(pick)
            out.append(pick)
    return out


def position_nulls(region: Sequence[CellKey], within: Sequence[CellKey], draws: int, seed: str) -> NullSets:
    """The region's slots moved to as many other whole positions of ``within`` (the i-th region
    position, in label order, to the i-th drawn one). A slot the drawn position lacks (the
    unembedding away from the last token) is replaced by a random key outside the region, so a
    null set has the region's size; those are counted in ``n_unmatched``."""
    slots: dict[str, list[str]] = defaultdict(list)
    for label, slot in region:
        slots[label].append(slot)
    have = set(within)
    others = sorted({label for label, _ in within} - set(slots))
    if len(others) < len(slots):
        return NullSets([], missing=f"{len(others)} other positions, fewer than the region's {len(slots)}")
    out, short = [], 0
    for j, pick in enumerate(_choices(others, len(slots), draws, seed)):
        keys = [(to, slot) for frm, to in zip(sorted(slots), pick) for slot in slots[frm]]
        kept = [k for k in keys if k in have]
        if len(kept) < len(keys):
            spare = sorted(have - set(kept) - set(region))
            fill = random.Random(f"{seed}:fill:{j}").sample(spare, min(len(spare), len(keys) - len(kept)))
            short += len(keys) - len(kept)
            kept += fill
        out.append(kept)
    return NullSets(out, short)


def _layer(slot: str) -> int | None:
    return slot_parts(slot)[0]


def _with_layer(slot: str, layer: int) -> str:
    return str(replace(SlotName.parse(slot), layer=layer))


def block_nulls(region: Sequence[CellKey], have: set[CellKey], n_layers: int) -> NullSets:
    """The region moved whole to every other contiguous block of layers of its span that does
    not overlap it."""
    layers = sorted({_layer(s) for _, s in region if _layer(s) is not None})
    if not layers:
        return NullSets([], missing="the region has no layers")
    first, width = layers[0], layers[-1] - layers[0] + 1
    out, short = [], 0
    for start in range(0, n_layers - width + 1):
        if start + width > first and start <= layers[-1]:
            continue
        keys = [(label, _with_layer(s, _layer(s) - first + start)) for label, s in region]
        kept = [k for k in keys if k in have]
        short += len(keys) - len(kept)
        out.append(kept)
    if not out:
        return NullSets([], missing=f"no other block of {width} layers in {n_layers}")
    return NullSets(out, short)


NORM = "norm"  # components named for a norm (attn_norm, ffn_norm, q_norm, ...): vectors, never a null's pool
MATCH = 0.25  # a null set's parameters within this fraction of the region's count as matched


def component_nulls(region: Sequence[CellKey], have: set[CellKey], draws: int, seed: str,
                    among: Sequence[str] | None = None, params: Mapping[str, int] | None = None) -> NullSets:
    """Other components at the region's positions and layers, as many as it has, or, with
    ``params`` (parameters per slot), sets of any size whose parameters match the region's
    (within ``MATCH``; where none does, the closest: ``param_ratio`` says how close). Norm vectors
    are never drawn (``among``: the components to draw from; default every other component the
    prompt has there)."""
    places = sorted({(label, _layer(s)) for label, s in region})
    mine = sorted({slot_parts(s)[1] for _, s in region})
    pool = sorted({slot_parts(s)[1] for label, s in have if (label, _layer(s)) in set(places)} - set(mine))
    pool = [c for c in pool if NORM not in c and (among is None or c in among)]
    by_place = {(label, _layer(s), slot_parts(s)[1]): (label, s) for label, s in have}
    if params is None:
        if len(pool) < len(mine):
            return NullSets([], missing=f"{len(pool)} other components at the region's layers, fewer than its {len(mine)}")
        picks = _choices(pool, len(mine), draws, seed)
        ratio = 1.0
    else:
        if not pool:
            return NullSets([], missing="no other component at the region's layers")

        def size(comps: Sequence[str]) -> int:
            return sum(params.get(k[1], 0) for label, layer in places for c in comps
                       if (k := by_place.get((label, layer, c))) is not None)

        target = sum(params.get(s, 0) for _, s in region)
        subsets = [c for n in range(1, len(pool) + 1) for c in itertools.combinations(pool, n)]
        gaps = {c: abs(size(c) / target - 1) if target else 0.0 for c in subsets}
        matched = [c for c in subsets if gaps[c] <= MATCH] or [min(subsets, key=lambda c: (gaps[c], c))]
        picks = matched if len(matched) <= draws else [matched[i] for i in sorted(
            random.Random(seed).sample(range(len(matched)), draws))]
        ratio = float(np.mean([size(c) / target for c in picks])) if target else 1.0
    out, short = [], 0
    for pick in picks:
        keys = [by_place.get((label, layer, c)) for label, layer in places for c in pick]
        short += sum(k is None for k in keys)
        out.append([k for k in keys if k is not None])
    return NullSets(out, short, param_ratio=ratio)
