"""Exact greedy refinement of a found cell set: the ranking takes cells in estimate order, so
its set holds cells that add little (or work against the target). Shrink it by exact marginal
gain: each round grafts the set without each one of its cells (one batched pass), orders the
cells by the share left without them, and removes the largest block of the cheapest
(1, 2, 4, ... cells, each block one exact graft of the same pass) whose removal keeps the
threshold: the target share where the set meets it, else the set's own share (so a set short
of the target only gets smaller and better). Stops when no single removal keeps the threshold
(the set is minimal under single removals) or after ``max_rounds`` rounds (then said so).
Every size and share reported is an exact graft.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from weightgraft.localization.verify import CellKey, SetVerifier


def _blocks(n: int) -> list[int]:
    """Block sizes to try in a round: 1, 2, 4, ... below ``n`` (a set never becomes empty)."""
    out = [1]
    while out[-1] * 2 < n:
        out.append(out[-1] * 2)
    return out


def refine_set(verifier: SetVerifier, found: Sequence[CellKey], found_share: float, target: float,
               max_rounds: int = 100, progress: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """The found set shrunk by exact marginal gain; its cells, exact share and every step.
    ``progress(round, size, share)`` is told after each round (a round grafts the set without
    each of its cells: minutes on a CPU for hundreds of cells)."""
    cells = list(found)
    share = found_share
    steps = [{"size": len(cells), "share": share, "removed": []}]
    stopped, rounds = "minimal", 0
    while len(cells) > 1:
        if rounds == max_rounds:
            stopped = "rounds"
            break
        rounds += 1
        threshold = target if share >= target else share
        without = verifier.shares([cells[:i] + cells[i + 1 :] for i in range(len(cells))])
        order = sorted(range(len(cells)), key=lambda i: (-without[i], i))
        sizes = _blocks(len(cells))
        drop = [set(order[:b]) for b in sizes]
        kept = [[c for i, c in enumerate(cells) if i not in d] for d in drop]
        values = [without[order[0]]] + verifier.shares(kept[1:])
        passing = [j for j, v in enumerate(values) if v >= threshold]
        if not passing:
            break
        j = max(passing)
        steps.append({"size": len(kept[j]), "share": values[j], "removed": [list(cells[i]) for i in sorted(drop[j])]})
        cells, share = kept[j], values[j]
        if progress is not None:
            progress(rounds, len(cells), share)
    return {"from_size": len(found), "from_share": found_share, "size": len(cells), "share": share,
            "reached": share >= target, "target_share": target, "rounds": rounds, "stopped": stopped,
            "cells": [{"position_label": p, "slot": s} for p, s in cells], "steps": steps}
