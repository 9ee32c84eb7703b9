"""Controls for a found cell set: is it special, or would any set of its size do?

Two kinds of control set, each of the found set's size and drawn from the candidate keys (every
key some prompt of the template has) outside the found set, so that no control shares a cell
with it: ``random`` (uniform without replacement) and ``matched`` (the found set's mix of
(position label, component) kept, the layer drawn anew: a set of 3 ``o`` cells at ``last`` is
matched by 3 ``o`` cells at ``last`` in other layers). A group with fewer keys outside the set
than the set holds (``unembed`` at ``last``: one key) gives what it has; the rest is drawn
uniformly from the complement, and each set records how many (``n_unmatched``). Each set is
drawn from its own string seed, recorded with its cells, so that anyone can draw it again
(:func:`draw_control`) or regraft the cells. Every share is exact: all control sets of a found
set are one batched engine pass (prefix sharing). Per kind: the empirical p-value of the found
set, ``(1 + #controls >= found) / (1 + n)``, and the share per cell of the set and the controls.

A draw (``draw_outside``) never contains a key of the set it is compared with. Where it matches a
mix, each group is drawn from its own keys outside the set; a group with too few of them gives
what it has, and the shortfall is drawn uniformly from the rest of the complement and counted
(``n_unmatched``). Every draw is reproducible from its seed string (``random.Random(seed)`` over
the sorted pool, so the draw depends on the set of candidates only).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypedDict, TypeVar

import numpy as np

from weightgraft.localization.maps import slot_parts
from weightgraft.localization.verify import CellKey, SetVerifier
from weightgraft.stats import empirical_p

K = TypeVar("K", bound=Hashable)


class DrawError(ValueError):
    """The complement holds fewer keys than the set to match."""


@dataclass(frozen=True)
class Draw(Generic[K]):
    """The keys drawn and how many of them could not be matched to their group."""

    keys: list[K]
    n_unmatched: int


def draw_outside(pool: Sequence[K], avoid: Sequence[K], size_like: Sequence[K], seed: str,
                 group: Callable[[K], Hashable] | None = None) -> Draw[K]:
    """``len(size_like)`` keys from ``pool`` minus ``avoid``: uniform (``group`` None) or with
    ``size_like``'s count of keys per ``group(key)``, the shortfall uniform from the rest."""
    rng = random.Random(seed)
    banned = set(avoid)
    outside = sorted(k for k in set(pool) if k not in banned)
    n = len(size_like)
    if len(outside) < n:
        raise DrawError(f"only {len(outside)} keys lie outside the set, fewer than its {n}")
    if group is None:
        return Draw(rng.sample(outside, n), 0)
    by_group: dict[Hashable, list[K]] = defaultdict(list)
    for key in outside:
        by_group[group(key)].append(key)
    chosen: list[K] = []
    short = 0
    for g, count in sorted(Counter(group(k) for k in size_like).items(), key=lambda gc: repr(gc[0])):
        keys = by_group.get(g, [])
        take = min(count, len(keys))
        chosen += rng.sample(keys, take)
        short += count - take
    if short:
        taken = set(chosen)
        rest = [k for k in outside if k not in taken]
        chosen += rng.sample(rest, short)
    return Draw(chosen, short)


Kind = Literal["random", "matched"]
KINDS: tuple[Kind, ...] = ("random", "matched")
AGREE = 1e-4  # the found set regrafted in the controls' pass must give its recorded share to this


def mix_key(key: CellKey) -> tuple[str, str]:
    """(position label, component) of a key: ``("last", "layers.3.o")`` -> ``("last", "o")``."""
    return key[0], slot_parts(key[1])[1]


def control_seed(seed: int, direction: str, template: str, kind: Kind, index: int, size: int) -> str:
    """The seed string of one control set (distinct per search, kind, set and found size)."""
    return f"{seed}:{direction}:{template}:{kind}:{size}:{index}"


def draw_control(candidates: Sequence[CellKey], found: Sequence[CellKey], kind: Kind, seed: str) -> Draw[CellKey]:
    """One control set of ``len(found)`` keys from ``candidates`` outside ``found``,
    reproducible from ``seed`` (:func:`draw_outside`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown control kind {kind!r}; use random or matched")
    return draw_outside(candidates, found, found, seed, mix_key if kind == "matched" else None)


class ControlStats(TypedDict):
    """A kind of control sets against the found set (:func:`control_stats`)."""

    mean: float
    p95: float
    max: float
    margin_over_mean: float
    margin_over_p95: float
    beats_p95: bool
    p: float  # empirical: the found set's share against the controls'
    share_per_cell: float
    controls_share_per_cell: float


def control_stats(found_share: float, shares: Sequence[float], size: int) -> ControlStats:
    """Mean, p95 and max of the controls' shares, the found set's margins and empirical
    p-value, and the share per cell of both (sets of ``size`` cells)."""
    arr = np.asarray(shares, dtype=float)
    mean, p95 = float(arr.mean()), float(np.percentile(arr, 95))
    return ControlStats(mean=mean, p95=p95, max=float(arr.max()), margin_over_mean=found_share - mean,
                        margin_over_p95=found_share - p95, beats_p95=bool(found_share > p95),
                        p=empirical_p(found_share, arr, above=True),
                        share_per_cell=found_share / size if size else float("nan"),
                        controls_share_per_cell=mean / size if size else float("nan"))


def set_controls(verifier: SetVerifier, found: Sequence[CellKey], found_share: float, *, n_sets: int,
                 seed: int, direction: str, template: str, heldout: SetVerifier | None = None,
                 heldout_share: float | None = None) -> dict[str, Any]:
    """``n_sets`` random and ``n_sets`` matched control sets of the found set, outside it: each
    set's seed, cells, unmatched count and exact share; per kind the statistics of
    :func:`control_stats`. With ``heldout`` (the held-out prompts' verifier) the same sets'
    shares there too, under ``heldout``. The found set is regrafted in the same pass; its share
    must agree with ``found_share``."""
    found = list(found)
    candidates = verifier.candidates()
    drawn: list[tuple[Kind, str, Draw[CellKey]]] = []
    out: dict[str, Any] = {"n_sets": n_sets, "n_candidates": len(candidates), "from_complement": True,
                           "found_share": found_share}
    for kind in KINDS:
        try:
            for i in range(n_sets):
                s = control_seed(seed, direction, template, kind, i, len(found))
                drawn.append((kind, s, draw_control(candidates, found, kind, s)))
        except DrawError as exc:
            out[kind] = {"not_drawn": str(exc)}
            drawn = [d for d in drawn if d[0] != kind]
    sets = [found] + [d.keys for _, _, d in drawn]
    shares = verifier.shares(sets)
    again, shares = shares[0], shares[1:]
    out.update({"found_share_regrafted": again, "agrees": abs(again - found_share) <= AGREE})
    held = None
    if heldout is not None:
        held = heldout.shares(sets)
        out["heldout_found_share"] = held[0] if heldout_share is None else heldout_share
        held = held[1:]
    for kind in KINDS:
        if kind in out:
            continue
        picked = [j for j, (k, _, _) in enumerate(drawn) if k == kind]
        values = [shares[j] for j in picked]
        entry = {**control_stats(found_share, values, len(found)),
                 "n_unmatched": sum(drawn[j][2].n_unmatched for j in picked),
                 "unmatched_drawn": "uniformly from the complement of the found set"}
        if held is not None:
            entry["heldout"] = control_stats(out["heldout_found_share"], [held[j] for j in picked], len(found))
        entry["sets"] = [{"seed": drawn[j][1], "share": shares[j], "n_unmatched": drawn[j][2].n_unmatched,
                          **({"heldout_share": held[j]} if held is not None else {}),
                          "cells": [list(c) for c in drawn[j][2].keys]} for j in picked]
        out[kind] = entry
    return out
