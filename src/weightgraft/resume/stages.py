"""Stages: an output computed once for its inputs and read back afterwards.

Two kinds, one idea. A *keyed* stage (what ``weightgraft paper`` runs as: a dataset, a finetune,
a sweep) has a folder named by a hash of its kind and inputs, finished by ``stage.json`` with
that key: a changed input gives another key, so another folder, and a result is never mixed with
one of other inputs; a folder without the record is a stage that was stopped (its own code
resumes from what it left: the Trainer's checkpoints, a sweep's saved rows). A stage *inside a
claimed folder* (localize's estimates per direction) is keyed by the folder's claim
(:meth:`~weightgraft.resume.folder.RunFolder.claim`): its output file, once written, is the stage
done.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from weightgraft import atomic
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import StageRecord

__all__ = ["KEY_CHARS", "STAGE_FILE", "STAGE_FORMAT", "Stage", "file_digest", "kept", "stage", "stage_key",
           "stage_path"]

STAGE_FILE = StageRecord.FILE
STAGE_FORMAT = "weightgraft-paper-stage/1"  # part of every key: the folders of earlier runs keep theirs
KEY_CHARS = 12

T = TypeVar("T")


def stage_key(kind: str, inputs: dict[str, Any]) -> str:
    """The sha256 (hex) of a stage's kind and inputs (JSON, keys sorted)."""
    text = json.dumps({"kind": kind, "format": STAGE_FORMAT, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Stage:
    """One keyed stage: ``kind`` (``data``, ``finetune``, ``sweep``, ``claims``, ``report``),
    ``name`` (``a2b``, ``fig2``), its inputs and the folder they name under ``root``."""

    kind: str
    name: str
    inputs: dict[str, Any]
    root: Path
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.key = stage_key(self.kind, {"name": self.name, **self.inputs})

    @property
    def folder(self) -> Path:
        return self.root / f"{self.kind}s" / f"{self.name}-{self.key[:KEY_CHARS]}"

    @property
    def record_path(self) -> Path:
        return self.folder / STAGE_FILE

    def finished(self) -> dict[str, Any] | None:
        """The stage's record if it finished with these inputs, else None (none, unreadable, or
        of other inputs)."""
        try:
            record = RunFolder(self.folder).read(StageRecord)
        except (OSError, ValueError):
            return None
        return record.as_json() if record is not None and record.key == self.key else None

    def finish(self, outputs: dict[str, Any], seconds: float) -> dict[str, Any]:
        """Write ``stage.json`` (atomically, last): the stage is done."""
        record = StageRecord(format=STAGE_FORMAT, kind=self.kind, name=self.name, key=self.key, inputs=self.inputs,
                             outputs=outputs, seconds=round(seconds, 1), finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        RunFolder(self.folder).write(record)
        return record.as_json()


def stage(kind: str, name: str, inputs: dict[str, Any], root: Path) -> Stage:
    """The keyed stage ``name`` of ``kind`` with ``inputs``, under ``root``."""
    return Stage(kind, name, inputs, root)


def stage_path(record: dict[str, Any], root: Path, output: str) -> Path:
    """The absolute path of a finished stage's output ``output`` (a name in its record's
    ``outputs``), under the run's ``root``."""
    folder = root / f"{record['kind']}s" / f"{record['name']}-{record['key'][:KEY_CHARS]}"
    return (folder / record["outputs"][output]).resolve()


def kept(path: Path, make: Callable[[], T], write: Callable[[T, Path], None],
         read: Callable[[Path], T]) -> tuple[T, bool]:
    """A stage inside a claimed folder: ``path`` read back where a run wrote it, else ``make()``
    written there (atomically) and returned; and whether it was read back."""
    if path.is_file():
        return read(path), True
    value = make()
    with atomic.atomic_path(path) as tmp:
        write(value, tmp)
    return value, False


def file_digest(*paths: Path) -> str:
    """The sha256 of the files' bytes, in order (what a data folder's content is keyed by)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()
