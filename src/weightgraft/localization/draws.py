"""Random key sets drawn outside a given set: the null regions of the claims and the control
sets of the found sets.

A draw never contains a key of the set it is compared with (``avoid``). Where it matches a mix
(so many keys of each group: a component, or a (position label, component) pair), each group
is drawn from its own keys outside ``avoid``; a group with too few of them gives what it has,
and the shortfall is drawn uniformly from the rest of the complement and counted
(``n_unmatched``). Every draw is reproducible from its seed string (``random.Random(seed)``
over the sorted pool, so the draw depends on the set of candidates only).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

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
