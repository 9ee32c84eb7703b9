"""Atomic file writes: a reader (or a run resumed after a crash) sees the old file or the new
one, never half of one.

Every file a run writes goes through here: the bytes go to a hidden temporary file in the same
folder, are flushed and fsynced, and ``os.replace`` puts them in place in one step. A writer
that dies mid-write (an exception, Ctrl-C, SIGKILL, a full disk) leaves the old file as it was;
the temporary file starts with a dot, so no run reads it as a part or a result.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _temporary(path: Path) -> Path:
    """Same folder, so ``os.replace`` is one rename; hidden and ending in ``.tmpPID``, so that
    no glob of the folder's files (``*.parquet``, ``part-*``) ever takes it for a finished one."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to (for writers that want a path:
    pandas, pyarrow, matplotlib); on a clean exit it replaces ``path``, on any error it is
    removed and ``path`` is left as it was. Its name does not end in ``path``'s suffix: a
    writer that picks the format from the name needs it given (``savefig(format=...)``)."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically."""
    write_bytes(path, text.encode(encoding))


def write_json(path: str | os.PathLike[str], data: Any, **dumps: Any) -> None:
    """Write ``data`` as JSON (``json.dumps`` keywords, default ``indent=2``) atomically."""
    write_text(path, json.dumps(data, **{"indent": 2, **dumps}) + "\n")
