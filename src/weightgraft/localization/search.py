"""Minimal graft search: the smallest set of cells, taken in attribution order and verified by
exact grafting, that carries a chosen share of the donor's effect over a dataset.

Cells are keyed across examples by ``(position label, slot name)`` so that one set means the
same thing in every prompt of a template (``weightgraft.localization.examples``); a key
an example lacks grafts nothing there. The share of a set K is
``mean_i [M_i(base + K) - M_i(base)] / mean_i [M_i(donor) - M_i(base)]``: for sufficiency
(base PRE, donor SFT) the share of SFT's gain recovered by grafting K into PRE; for necessity
(base SFT, donor PRE) the share of it lost by removing K from SFT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torch import nn

from weightgraft.engine.attribution import Metric
from weightgraft.engine.cells import Cell, ScoredExample
from weightgraft.errors import WeightgraftError
from weightgraft.localization.verify import CellKey, SetVerifier


class SearchError(WeightgraftError, ValueError):
    """Examples on which no graft set can be searched for (no estimates, or no effect to recover)."""


@dataclass
class SearchResult:
    """The set found, the verified share at every size tried, and whether the target was met."""

    target_share: float
    cells: list[CellKey]
    share: float
    reached: bool
    total_effect: float  # mean_i M_i(donor) - M_i(base)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (size, exact share)

    def to_json(self) -> dict:
        return {
            "target_share": self.target_share, "size": len(self.cells), "share": self.share,
            "reached": self.reached, "total_effect": self.total_effect,
            "cells": [{"position_label": p, "slot": s} for p, s in self.cells],
            "curve": [{"size": n, "share": v} for n, v in self.curve],
        }


def growing_sizes(n: int, dense: int = 16, growth: float = 1.25) -> list[int]:
    """Sizes to verify: every size up to ``dense``, then geometric steps, then ``n``."""
    sizes = list(range(1, min(dense, n) + 1))
    while sizes and sizes[-1] < n:
        sizes.append(min(n, max(sizes[-1] + 1, int(sizes[-1] * growth))))
    return sizes


class _Verifier:
    """Exact shares of growing prefixes of a ranking (each batch of sizes one engine pass),
    remembered by size."""

    def __init__(self, sets: SetVerifier) -> None:
        self.sets, self.total = sets, sets.total
        self.seen: dict[int, float] = {}

    def shares(self, ranking: Sequence[CellKey], sizes: Sequence[int]) -> list[float]:
        todo = [n for n in sizes if n not in self.seen]
        if todo:
            for n, v in zip(todo, self.sets.shares([ranking[:n] for n in todo])):
                self.seen[n] = v
        return [self.seen[n] for n in sizes]


def minimal_graft_search(
    models: Sequence[nn.Module], examples: Sequence[ScoredExample],
    cell_maps: Sequence[dict[CellKey, Cell]], *, estimates: Mapping[CellKey, float], pad_id: int,
    target_share: float = 0.9, max_cells: int = 1024, batch_sizes: int = 8, chunk: int = 512,
    metric: Metric = "first_logprob", total: float | None = None,
) -> SearchResult:
    """Rank keys by ``estimates`` in the direction of the donor's total effect, then verify
    growing prefixes of that ranking exactly (``batch_sizes`` sizes per pass) until one
    carries ``target_share``; then bisect down to the smallest prefix that does. ``cell_maps[i]``
    maps each key to example i's cell; ``metric`` is the exact metric the shares are measured in
    (the one the estimates ranked). ``total``: the donor's whole effect, where the maps'
    keys do not cover every cell (unit keys: the top few by estimate)."""
    if not 0 < target_share <= 1:
        raise ValueError("target_share must lie in (0, 1]")
    if not estimates:
        raise SearchError("nothing to search: no cell estimates")
    verify = _Verifier(SetVerifier(models, examples, cell_maps, pad_id, metric, chunk, total))
    if verify.total == 0:
        raise SearchError("the donor does not change the metric on these examples: no share to recover")
    ranking = rank_keys(estimates, 1.0 if verify.total > 0 else -1.0)
    sizes = growing_sizes(min(len(ranking), max_cells))
    found = None
    for start in range(0, len(sizes), batch_sizes):
        batch = sizes[start : start + batch_sizes]
        for n, v in zip(batch, verify.shares(ranking, batch)):
            if v >= target_share:
                found = n
                break
        if found is not None:
            break
    if found is not None:  # bisect between the last size that failed and the one that passed
        lower = max([n for n in verify.seen if n < found and verify.seen[n] < target_share], default=0)
        lo, hi = lower, found
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if verify.shares(ranking, [mid])[0] >= target_share:
                hi = mid
            else:
                lo = mid
        found = hi
    size = found if found is not None else max(verify.seen)
    curve = sorted(verify.seen.items())
    return SearchResult(target_share, list(ranking[:size]), verify.seen[size], found is not None,
                        verify.total, curve)


def rank_keys(estimates: dict[CellKey, float], total_effect_sign: float) -> list[CellKey]:
    """Keys by their summed estimate in the direction of the donor's effect, strongest first."""
    return sorted(estimates, key=lambda k: -total_effect_sign * estimates[k])
