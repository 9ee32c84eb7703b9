"""Resumable stages (what ``weightgraft paper`` runs as): each stage's output folder is named by
a hash of its inputs and holds ``stage.json`` (with that key) once the stage has finished.

A stage whose folder carries ``stage.json`` with its key is reused as it is; a folder without
one is a stage that was stopped (its own code resumes from what it left: the Trainer's
checkpoints, a sweep's saved rows). A changed input gives another key, so another folder: a
result is never mixed with one of other inputs.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightgraft import atomic

STAGE_FILE = "stage.json"
STAGE_FORMAT = "weightgraft-paper-stage/1"  # part of every key: the folders of earlier runs keep theirs
KEY_CHARS = 12


def stage_key(kind: str, inputs: dict[str, Any]) -> str:
    """The sha256 (hex) of a stage's kind and inputs (JSON, keys sorted)."""
    text = json.dumps({"kind": kind, "format": STAGE_FORMAT, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Stage:
    """One stage: ``kind`` (``data``, ``finetune``, ``sweep``, ``report``), ``name`` (``a2b``,
    ``fig2``), its inputs and the folder they name."""

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
        """The stage's record if it finished with these inputs, else None."""
        try:
            record = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return None
        return record if record.get("key") == self.key else None

    def finish(self, outputs: dict[str, Any], seconds: float) -> dict[str, Any]:
        """Write ``stage.json`` (atomically, last): the stage is done."""
        record = {"format": STAGE_FORMAT, "kind": self.kind, "name": self.name, "key": self.key,
                  "inputs": self.inputs, "outputs": outputs, "seconds": round(seconds, 1),
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self.record_path, record, indent=1, sort_keys=True, default=str)
        return record


def stage_path(record: dict[str, Any], root: Path, output: str) -> Path:
    """The absolute path of a finished stage's output ``output`` (a name in its record's
    ``outputs``), under the run's ``root``."""
    folder = root / f"{record['kind']}s" / f"{record['name']}-{record['key'][:KEY_CHARS]}"
    return (folder / record["outputs"][output]).resolve()


def file_digest(*paths: Path) -> str:
    """The sha256 of the files' bytes, in order (what a data folder's content is keyed by)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()
