"""Controls for a found cell set: is it special, or would any set of its size do?

Two kinds of control set, each of the found set's size and drawn from the candidate keys (every
key some prompt of the template has): ``random`` (uniform without replacement) and ``matched``
(the found set's mix of (position label, component) kept, the layer drawn anew: a set of 3 ``o``
cells at ``last`` is matched by 3 ``o`` cells at ``last`` in other layers). Each set is drawn
from its own string seed (``random.Random(seed)``), recorded with its cells, so that anyone can
draw it again (:func:`draw_control`) or regraft the cells. Every share is exact: all control
sets of a found set are one batched engine pass (prefix sharing).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from weightgraft.localize.maps import slot_parts
from weightgraft.localize.verify import CellKey, SetVerifier

Kind = Literal["random", "matched"]
KINDS: tuple[Kind, ...] = ("random", "matched")
AGREE = 1e-4  # the found set regrafted in the controls' pass must give its recorded share to this


def mix_key(key: CellKey) -> tuple[str, str]:
    """(position label, component) of a key: ``("last", "layers.3.o")`` -> ``("last", "o")``."""
    return key[0], slot_parts(key[1])[1]


def control_seed(seed: int, direction: str, template: str, kind: Kind, index: int, size: int) -> str:
    """The seed string of one control set (distinct per search, kind, set and found size)."""
    return f"{seed}:{direction}:{template}:{kind}:{size}:{index}"


def draw_control(candidates: Sequence[CellKey], found: Sequence[CellKey], kind: Kind, seed: str) -> list[CellKey]:
    """One control set of ``len(found)`` keys from ``candidates`` (sorted first, so the draw
    depends on the set of candidates only), reproducible from ``seed``."""
    rng = random.Random(seed)
    pool = sorted(set(candidates))
    if kind == "random":
        return rng.sample(pool, len(found))
    if kind != "matched":
        raise ValueError(f"unknown control kind {kind!r}; use random or matched")
    groups: dict[tuple[str, str], list[CellKey]] = defaultdict(list)
    for key in pool:
        groups[mix_key(key)].append(key)
    out: list[CellKey] = []
    for group, count in sorted(Counter(mix_key(k) for k in found).items()):
        if len(groups[group]) < count:
            raise ValueError(f"found set has {count} cells of {group}, the candidates only {len(groups[group])}")
        out += rng.sample(groups[group], count)
    return out


def _stats(found_share: float, shares: list[float]) -> dict[str, Any]:
    arr = np.asarray(shares, dtype=float)
    mean, p95 = float(arr.mean()), float(np.percentile(arr, 95))
    return {"mean": mean, "p95": p95, "max": float(arr.max()), "margin_over_mean": found_share - mean,
            "margin_over_p95": found_share - p95, "beats_p95": bool(found_share > p95)}


def set_controls(verifier: SetVerifier, found: Sequence[CellKey], found_share: float, n_sets: int,
                 seed: int, direction: str, template: str) -> dict[str, Any]:
    """``n_sets`` random and ``n_sets`` matched control sets of the found set: each set's seed,
    cells and exact share; per kind the mean, 95th percentile and the found set's margins.
    The found set is regrafted in the same pass; its share must agree with ``found_share``."""
    found = list(found)
    candidates = verifier.candidates()
    drawn: list[tuple[Kind, str, list[CellKey]]] = []
    for kind in KINDS:
        for i in range(n_sets):
            s = control_seed(seed, direction, template, kind, i, len(found))
            drawn.append((kind, s, draw_control(candidates, found, kind, s)))
    shares = verifier.shares([found] + [cells for _, _, cells in drawn])
    again, shares = shares[0], shares[1:]
    out: dict[str, Any] = {"n_sets": n_sets, "n_candidates": len(candidates), "found_share": found_share,
                           "found_share_regrafted": again, "agrees": abs(again - found_share) <= AGREE}
    for kind in KINDS:
        rows = [(s, cells, v) for (k, s, cells), v in zip(drawn, shares) if k == kind]
        values = [v for _, _, v in rows]
        same = sum(set(cells) == set(found) for _, cells, _ in rows)
        out[kind] = {**_stats(found_share, values), "identical_to_found": same,
                     "sets": [{"seed": s, "share": v, "cells": [list(c) for c in cells]} for s, cells, v in rows]}
    return out
