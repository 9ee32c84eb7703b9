"""A run folder and its records: the one place where a pipeline's record (a sweep's
``identity.json`` and ``manifest.json``, localize's ``manifest.json``, a stage's ``stage.json``)
is read, claimed and written.

Why one place: a record written by hand in several steps of a pipeline drifts (a key renamed in
one writer, a note lost by another that rewrote the file from scratch); here every record is a
typed model (:mod:`weightgraft.resume.manifests`) that keeps what it does not know, every write
is atomic, and :meth:`RunFolder.claim` applies the one rule of :mod:`weightgraft.resume.claim`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict

from weightgraft.resume.claim import Identity, Wording, refuse_conflict

if TYPE_CHECKING:  # parts reads pandas; a folder's records do not (the CLI starts without pandas)
    from weightgraft.resume.parts import Parts

__all__ = ["Record", "RunFolder"]


class Record(BaseModel):
    """A JSON record of a run folder. Keys it does not declare (written by an earlier or a later
    weightgraft) are kept as they are; a key it declares but the file lacks takes its default."""

    model_config = ConfigDict(extra="allow")
    FILE: ClassVar[str] = "record.json"
    INDENT: ClassVar[int] = 2  # how the file is written (as earlier versions wrote it)
    SORT_KEYS: ClassVar[bool] = False

    def claim(self) -> Identity:
        """What the folder's rows depend on, as the claim rule reads it (a claim's record says)."""
        raise NotImplementedError(f"{type(self).__name__} is not a claim")

    def claimed(self, identity: Identity, now: Self) -> Self:
        """This (found) record once ``identity`` (merged with ``now``'s) is its own and ``now``'s
        settings (its config) replace the found ones."""
        raise NotImplementedError(f"{type(self).__name__} is not a claim")

    def updated(self, **fields: Any) -> Self:
        """This record with ``fields`` set, every other key kept."""
        return type(self).model_validate({**self.as_json(), **fields})

    def as_json(self) -> dict[str, Any]:
        """The keys the file holds (and those set since), as JSON values."""
        return json.loads(json.dumps(self.model_dump(mode="json", exclude_unset=True), default=str))


R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class RunFolder:
    """A pipeline's folder: its records and its rows (``parts``)."""

    path: Path

    def file(self, kind: type[Record]) -> Path:
        return self.path / kind.FILE

    def read(self, kind: type[R]) -> R | None:
        """The record ``kind`` the folder holds, None where it holds none."""
        path = self.file(kind)
        if not path.is_file():
            return None
        return kind.model_validate(json.loads(path.read_text(encoding="utf-8")))

    def write(self, record: Record) -> None:
        """Write ``record`` (atomically): the only write of a record in any pipeline."""
        self.path.mkdir(parents=True, exist_ok=True)
        kind = type(record)
        text = json.dumps(record.as_json(), indent=kind.INDENT, sort_keys=kind.SORT_KEYS, default=str) + "\n"
        from weightgraft.resume.parts import write_atomic

        write_atomic(self.file(type(record)), text.encode())

    def update(self, kind: type[R], **fields: Any) -> R:
        """Add ``fields`` to the record ``kind`` (what a run found out: prompt counts, models)."""
        found = self.read(kind)
        record = kind.model_validate(fields) if found is None else found.updated(**fields)
        self.write(record)
        return record

    def claim(self, kind: type[R], now: R, wording: Wording, *, same_core: Callable[[R], bool] | None = None,
              write: bool = True) -> R:
        """The folder for a run whose record is ``now``: its own (nothing claimed it yet), or one
        whose claim this run may extend (then merged: entries added, lists appended), else the
        pipeline's one line (:class:`~weightgraft.errors.ResultsDirConflict`). ``same_core``: the
        pipeline's way of comparing cores (a core re-derived under today's rules); ``write``:
        False where the claim is written with the first row only."""
        found = self.read(kind)
        record = now
        if found is not None:
            refuse_conflict(found.claim(), now.claim(), wording, None if same_core is None else same_core(found))
            record = found.claimed(found.claim().merged(now.claim()), now)
        if write:
            self.write(record)
        return record

    def parts(self, prefix: str, *, under: str = "parts", digits: int = 6, shared: str | None = None) -> Parts:
        """The parts ``{prefix}{n}.parquet`` under ``under`` (:class:`~weightgraft.resume.parts.Parts`)."""
        from weightgraft.resume.parts import Parts

        return Parts(self.path / under, prefix, digits, shared)
