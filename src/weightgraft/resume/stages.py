"""Stages: an output computed once for its inputs and read back afterwards.

Two kinds, one idea: a stage is keyed by a hash of its kind and inputs, and its output is read
back only where its record holds that key; a changed input gives another key, so the stage is
computed again, and a result is never mixed with one of other inputs.

- A *keyed* stage (:class:`Stage`: what ``weightgraft paper`` runs as: a dataset, a finetune, a
  sweep) has a folder named by its key, finished by ``stage.json``
  (:class:`~weightgraft.resume.manifests.StageRecord`, its outputs typed by the stage); a folder
  without the record is a stage that was stopped (its own code resumes from what it left: the
  Trainer's checkpoints, a sweep's saved rows).
- A stage *inside a claimed folder* (:class:`FolderStage`: localize's search and stability) has
  its files in the folder and its record in the folder's ``stages.json``
  (:class:`~weightgraft.resume.manifests.FolderStages`), written after its files.

Rows kept per prompt (localize's estimates and exact cells) are neither: they are parts read back
by their keys (:mod:`~weightgraft.resume.parts`, ``localization.exact_parts``), since a claimed
folder's prompts may grow and a file that one session wrote holds only that session's prompts.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast, overload

import pandas as pd

from weightgraft.resume.folder import Record, RunFolder
from weightgraft.resume.manifests import FolderStages, StageFiles, StageRecord

__all__ = ["KEY_CHARS", "STAGE_FILE", "STAGE_FORMAT", "FolderStage", "Stage", "file_digest", "frame_digest", "stage",
           "stage_key", "stage_path"]

STAGE_FILE = StageRecord.FILE
STAGE_FORMAT = "weightgraft-paper-stage/1"  # part of every key: the folders of earlier runs keep theirs
KEY_CHARS = 12

T = TypeVar("T")
Out = TypeVar("Out", bound=Record)


def stage_key(kind: str, inputs: dict[str, Any]) -> str:
    """The sha256 (hex) of a stage's kind and inputs (JSON, keys sorted)."""
    text = json.dumps({"kind": kind, "format": STAGE_FORMAT, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def record_type(outputs: type[Out]) -> type[StageRecord[Out]]:
    """The record of a stage whose outputs are ``outputs``."""
    return cast("type[StageRecord[Out]]", StageRecord[outputs])  # type: ignore[valid-type]


class Stage(Generic[Out]):
    """One keyed stage: ``kind`` (``data``, ``finetune``, ``sweep``, ``claims``, ``report``),
    ``name`` (``a2b``, ``fig2``), its inputs and the folder they name under ``root``; its record
    holds outputs of type ``outputs`` (untyped: :class:`~weightgraft.resume.folder.Record`, which
    keeps every key)."""

    @overload
    def __init__(self: Stage[Record], kind: str, name: str, inputs: dict[str, Any], root: Path) -> None: ...

    @overload
    def __init__(self, kind: str, name: str, inputs: dict[str, Any], root: Path, outputs: type[Out]) -> None: ...

    def __init__(self, kind: str, name: str, inputs: dict[str, Any], root: Path,
                 outputs: type[Any] = Record) -> None:
        self.kind, self.name, self.inputs, self.root, self.outputs = kind, name, inputs, root, outputs
        self.key = stage_key(kind, {"name": name, **inputs})

    @property
    def folder(self) -> Path:
        return self.root / f"{self.kind}s" / f"{self.name}-{self.key[:KEY_CHARS]}"

    @property
    def record_path(self) -> Path:
        return self.folder / STAGE_FILE

    def finished(self) -> StageRecord[Out] | None:
        """The stage's record if it finished with these inputs, else None (none, unreadable, or
        of other inputs)."""
        try:
            record = RunFolder(self.folder).read(record_type(self.outputs))
        except (OSError, ValueError):
            return None
        return record if record is not None and record.key == self.key else None

    def finish(self, outputs: Out, seconds: float) -> StageRecord[Out]:
        """Write ``stage.json`` (atomically, last): the stage is done."""
        record = record_type(self.outputs)(format=STAGE_FORMAT, kind=self.kind, name=self.name, key=self.key,
                                           inputs=self.inputs, outputs=outputs, seconds=round(seconds, 1),
                                           finished=_now())
        RunFolder(self.folder).write(record)
        return record


def stage(kind: str, name: str, inputs: dict[str, Any], root: Path) -> Stage[Record]:
    """The keyed stage ``name`` of ``kind`` with ``inputs``, under ``root``."""
    return Stage(kind, name, inputs, root)


def stage_path(record: StageRecord[Any], root: Path, output: str) -> Path:
    """The absolute path of a finished stage's output ``output`` (a name in its record's
    ``outputs``), under the run's ``root``."""
    folder = root / f"{record.kind}s" / f"{record.name}-{record.key[:KEY_CHARS]}"
    return (folder / str(getattr(record.outputs, output))).resolve()


@dataclass(frozen=True)
class FolderStage:
    """A stage inside a claimed run folder, keyed by its inputs: its ``files`` (under the folder)
    are read back while the folder's ``stages.json`` holds its key; with another key (an input
    changed since) or none (a run stopped in it, or made before the stage was keyed) it is
    computed again, by code that may resume from what its files hold."""

    folder: RunFolder
    name: str
    inputs: dict[str, Any]
    files: tuple[str, ...]
    key: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", stage_key(self.name, self.inputs))

    def finished(self) -> StageRecord[StageFiles] | None:
        """Its record where it finished with these inputs and its files are there, else None."""
        try:
            found = self.folder.read(FolderStages)
        except (OSError, ValueError):
            return None
        record = found.stages.get(self.name) if found is not None else None
        if record is None or record.key != self.key:
            return None
        return record if all((self.folder.path / f).is_file() for f in self.files) else None

    def finish(self, seconds: float) -> StageRecord[StageFiles]:
        """Record the stage done (after its files were written)."""
        record = StageRecord[StageFiles](format=STAGE_FORMAT, kind=self.name, name=self.name, key=self.key,
                                         inputs=self.inputs, outputs=StageFiles(files=list(self.files)),
                                         seconds=round(seconds, 1), finished=_now())
        found = self.folder.read(FolderStages)
        self.folder.write(FolderStages(stages={**(found.stages if found else {}), self.name: record}))
        return record

    def run(self, make: Callable[[], T], read: Callable[[], T]) -> tuple[T, bool]:
        """``read()`` where the stage finished with these inputs, else ``make()`` (which writes
        its files) and the stage recorded; and whether it was read back."""
        if self.finished() is not None:
            return read(), True
        t0 = time.time()
        value = make()
        self.finish(time.time() - t0)
        return value, False


def file_digest(*paths: Path) -> str:
    """The sha256 of the files' bytes, in order (what a data folder's content is keyed by)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def frame_digest(frame: pd.DataFrame) -> str:
    """The sha256 of a frame's columns and values, row by row in order (what a map is keyed by)."""
    h = hashlib.sha256(json.dumps([str(c) for c in frame.columns]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return h.hexdigest()
