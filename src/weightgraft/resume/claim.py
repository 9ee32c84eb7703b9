"""A folder's claim: the record of the inputs its rows came from, which later work may extend
but never change.

Why: a rerun with more prompts, schemes or models adds rows to a run's folder; a rerun in which
a prompt's content, a scheme's definition or a model of the list changed would mix rows of
other inputs with these. Each pipeline records per-entry digests (prompt -> digest, scheme ->
digest) and lists (its models, in order); these two checks say what a rerun may not do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["changed_entries", "extends"]


def changed_entries(recorded: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The entries (sorted) both records hold with other digests: the ones a rerun changed.
    An entry only one of them holds is work added or not asked for, and fine."""
    return sorted(k for k in recorded.keys() & now.keys() if recorded[k] != now[k])


def extends(recorded: Sequence[str], now: Sequence[str]) -> bool:
    """Whether ``now`` keeps ``recorded`` as its start: appended to, not changed or shortened."""
    return list(now[: len(recorded)]) == list(recorded)
