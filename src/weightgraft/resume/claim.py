"""A folder's claim: the record of the inputs its rows came from, which later work may extend
but never change. One rule for every pipeline says whether a folder is this run (resume it),
or another one (refuse it, in one line).

Why: a rerun with more prompts, schemes or models adds rows to a run's folder; a rerun in which
a prompt's content, a scheme's definition or a model of the list changed would mix rows of
other inputs with these. An :class:`Identity` is what every pipeline's claim says: a format
version (how rows are written), a core digest (settings that change every row), a digest per
entry (prompt -> digest, scheme -> digest, role -> weights) and lists that may only grow (the
SFT models, in order). :func:`conflict` is the rule; each pipeline words the refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from weightgraft.errors import ResultsDirConflict

__all__ = ["Conflict", "Identity", "Wording", "changed_entries", "conflict", "extends", "refuse_conflict"]


def changed_entries(recorded: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The entries (sorted) both records hold with other digests: the ones a rerun changed.
    An entry only one of them holds is work added or not asked for, and fine."""
    return sorted(k for k in recorded.keys() & now.keys() if recorded[k] != now[k])


def extends(recorded: Sequence[str], now: Sequence[str]) -> bool:
    """Whether ``now`` keeps ``recorded`` as its start: appended to, not changed or shortened."""
    return list(now[: len(recorded)]) == list(recorded)


@dataclass(frozen=True)
class Identity:
    """What a folder's rows depend on, as the rule reads it (each pipeline's record says it so).

    ``format``: how rows are written (a folder of another format is refused, never converted);
    ``core``: the digest of the settings every row depends on; ``entries``: per kind (``schemes``,
    ``examples``, ``models/SET``) a digest per entry, which may be added to but not changed;
    ``lists``: per kind the lists (models, in order) that may be appended to only."""

    format: int
    core: str | None
    entries: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    lists: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def merged(self, now: Identity) -> Identity:
        """The folder's identity once ``now``'s work is added: today's format, core and lists,
        every entry either holds (``now``'s digest where both do: they agree, or it was refused)."""
        kinds = dict.fromkeys([*self.entries, *now.entries])
        entries = {k: {**self.entries.get(k, {}), **now.entries.get(k, {})} for k in kinds}
        return Identity(now.format, now.core, entries, dict(now.lists))


@dataclass(frozen=True)
class Conflict:
    """Why a folder is not this run: ``what`` failed (``format``, ``core``, a ``list``, an
    ``entry`` kind), with the kind, what the folder holds and what this run has."""

    what: Literal["format", "core", "list", "entry"]
    kind: str = ""
    names: Sequence[str] = ()  # the changed entries, sorted
    found: object = None
    now: object = None


Wording = Callable[[Conflict], str]  # a pipeline's one line for a conflict


def conflict(found: Identity, now: Identity, same_core: bool | None = None) -> Conflict | None:
    """The one rule: a folder is this run when its format and core are this run's, each list of
    it is the start of this run's, and no entry both hold has another digest. ``same_core``:
    the pipeline's own answer where its core is compared another way (re-derived under today's
    rules)."""
    if found.format != now.format:
        return Conflict("format", found=found.format, now=now.format)
    if not (found.core == now.core if same_core is None else same_core):
        return Conflict("core", found=found.core, now=now.core)
    for kind, before in found.lists.items():
        if not extends(before, now.lists.get(kind, ())):
            return Conflict("list", kind, found=list(before), now=list(now.lists.get(kind, ())))
    for kind, recorded in found.entries.items():
        changed = changed_entries(recorded, now.entries.get(kind, {}))
        if changed:
            return Conflict("entry", kind, changed, dict(recorded), dict(now.entries.get(kind, {})))
    return None


def refuse_conflict(found: Identity, now: Identity, wording: Wording, same_core: bool | None = None) -> None:
    """Raise :class:`ResultsDirConflict` with the pipeline's line where the rule refuses."""
    problem = conflict(found, now, same_core)
    if problem is not None:
        raise ResultsDirConflict(wording(problem))
