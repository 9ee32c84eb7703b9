"""Painted cells follow their tokens when the prompt is edited: the old and new token lists are
aligned (``difflib.SequenceMatcher`` on the token texts, leading spaces aside, so "Tre" stays
on " Tre" when a word is typed in front), each new token takes the paint of the old token it
matches, and what moved or found no token again is named, never silent."""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import TypedDict


def _key(token: str) -> str:
    return token.lstrip() or token


def align(before: Sequence[str], after: Sequence[str]) -> list[int | None]:
    """For each token of ``after``, the position of the token of ``before`` it is (equal text
    in the longest matching blocks), or ``None`` for a token the edit made."""
    matcher = SequenceMatcher(None, [_key(t) for t in before], [_key(t) for t in after], autojunk=False)
    origin: list[int | None] = [None] * len(after)
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            origin[block.b + i] = block.a + i
    return origin


Moved = TypedDict("Moved", {"token": str, "from": int, "to": int})  # an old position now at another number
Dropped = TypedDict("Dropped", {"token": str, "from": int})  # an old position with no token now


class Anchoring(TypedDict):
    """``/api/tokens``' ``anchor``: where the previous prompt's tokens are now."""

    origin: list[int | None]  # per new position, the old one it continues (None: new)
    moved: list[Moved]
    dropped: list[Dropped]


def anchoring(before: Sequence[str], after: Sequence[str]) -> Anchoring:
    """``origin`` (``align``), the old positions that moved to another number and those with no
    token now (``dropped``), as the page reports them."""
    origin = align(before, after)
    kept = {old for old in origin if old is not None}
    moved = [Moved({"token": before[old], "from": old, "to": new}) for new, old in enumerate(origin)
             if old is not None and old != new]
    dropped = [Dropped({"token": before[old], "from": old}) for old in range(len(before)) if old not in kept]
    return Anchoring(origin=origin, moved=moved, dropped=dropped)
