"""Rows saved as parquet parts in one folder, each part written atomically, read back by key.

Why: a run killed at any moment (SIGKILL included) must lose at most the part in flight and
never leave a half-written or duplicated row; a rerun reads every part and computes only the
keys no part holds. The results store (``experiments.store``: a part per batch of a sweep) and
localize's exact cells (a part per group of prompts) keep their rows this way.
"""

from __future__ import annotations

import errno
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from weightgraft import atomic
from weightgraft.errors import ResultsWriteError

__all__ = ["Parts", "write_atomic"]


@contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Ctrl-C (SIGINT) during the block takes effect when the block is done, so that a file
    being written is finished first (then the run stops with its one-line message)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    try:
        with _ctrl_c_after():
            atomic.write_bytes(path, data)
    except OSError as exc:
        hint = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise ResultsWriteError(
            exc.errno, f"could not write {path}: {hint}; results written before are intact in "
            f"{path.parent}, and re-running the same command resumes from them"
        ) from exc


@dataclass(frozen=True)
class Parts:
    """The parts ``{prefix}{n}.parquet`` in ``folder`` (``n`` zero-padded to ``digits``) that
    this writer adds; it reads every part named ``{shared}*.parquet`` (default: its own), so
    that several processes writing side by side, each its own prefix, read each other's rows."""

    folder: Path
    prefix: str
    digits: int = 6
    shared: str | None = None

    def paths(self) -> list[Path]:
        """Every readable part, in name order (the order they are read in)."""
        return sorted(self.folder.glob(f"{self.shared if self.shared is not None else self.prefix}*.parquet"))

    def frames(self) -> list[pd.DataFrame]:
        return [pd.read_parquet(path) for path in self.paths()]

    def read(self) -> pd.DataFrame:
        """Every part's rows, in one frame (an empty frame where there is no part)."""
        frames = self.frames()
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def keys(self, columns: Sequence[str]) -> set[tuple]:
        """The keys (values of ``columns``) of every saved row."""
        frame = self.read()
        return set() if frame.empty else set(frame[list(columns)].itertuples(index=False, name=None))

    def add(self, frame: pd.DataFrame) -> Path:
        """Save ``frame`` as this writer's next part (the first free number); its path."""
        n = 0
        while (path := self.folder / f"{self.prefix}{n:0{self.digits}d}.parquet").exists():
            n += 1
        write_atomic(path, frame.to_parquet(index=False))
        return path
