"""The results store: one row per (model set, template, scheme, example), safe to kill.

Each finished batch is written as its own parquet part, atomically (temporary file, fsync,
rename), so a run killed at any moment (SIGKILL included) loses at most the batch in flight
and never leaves a half-written or duplicated row. ``results.parquet`` is rebuilt from the
parts in a canonical order, so a resumed run yields the same file as an uninterrupted one.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

KEY = ("model_set", "template", "scheme", "example_id")


class ResultsDirConflict(ValueError):
    """The results directory holds results of a different experiment config."""


class ResultsWriteError(OSError):
    """Results could not be written (disk full, permissions); earlier results are intact."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        hint = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise ResultsWriteError(
            exc.errno, f"could not write {path}: {hint}; results written before are intact in "
            f"{path.parent}, and re-running the same command resumes from them"
        ) from exc


class ResultsStore:
    """Parts under ``run_dir/parts``; the identity of the config that owns the directory."""

    def __init__(self, run_dir: Path, identity: str, config: dict[str, Any], writer: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.writer = writer  # several processes write parts side by side, each its own
        self.parts = self.run_dir / "parts"
        try:
            self.parts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsWriteError(exc.errno, f"cannot create results directory {self.parts}: {exc.strerror}") from exc
        if not os.access(self.run_dir, os.W_OK):
            raise ResultsWriteError(errno.EACCES, f"results directory {self.run_dir} is not writable")
        owner = self.run_dir / "identity.json"
        if owner.exists():
            found = json.loads(owner.read_text())
            if found.get("identity") != identity:
                raise ResultsDirConflict(
                    f"{self.run_dir} holds results of another experiment config "
                    f"(identity {found.get('identity')}, this one is {identity}); results are "
                    "never mixed: choose another output directory (out=...) or delete it"
                )
        else:
            write_atomic(owner, json.dumps({"identity": identity, "config": config}, indent=2).encode())

    def _part_files(self) -> list[Path]:
        return sorted(p for p in self.parts.glob("part-*.parquet"))

    def read(self) -> pd.DataFrame:
        files = self._part_files()
        if not files:
            return pd.DataFrame()
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)

    def done(self) -> set[tuple]:
        frame = self.read()
        if frame.empty:
            return set()
        return set(frame[list(KEY)].itertuples(index=False, name=None))

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        stem = f"part-{self.writer}-" if self.writer else "part-"
        pattern = f"{stem}*.parquet" if self.writer else "part-[0-9]*.parquet"
        number = len(list(self.parts.glob(pattern)))
        path = self.parts / f"{stem}{number:06d}.parquet"
        write_atomic(path, pd.DataFrame(rows).to_parquet(index=False))

    def consolidate(self, order: Iterable[tuple]) -> pd.DataFrame:
        """``results.parquet`` in the canonical order ``order`` (keys); duplicates refused."""
        frame = self.read()
        if frame.empty:
            return frame
        keys = list(frame[list(KEY)].itertuples(index=False, name=None))
        if len(set(keys)) != len(keys):
            raise RuntimeError(f"duplicate result rows in {self.parts}; this is a bug, please report it")
        rank = {key: i for i, key in enumerate(order)}
        frame["_rank"] = [rank.get(k, len(rank)) for k in keys]
        frame = frame.sort_values("_rank", kind="stable").drop(columns="_rank").reset_index(drop=True)
        write_atomic(self.run_dir / "results.parquet", frame.to_parquet(index=False))
        return frame
