"""Relation metadata: reading custom JSONL, checking rows, assigning ids and groups."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import DataError, MetadataRowError, NotEnoughDataError
from .sampling import derive_rng

GROUPS = ("task", "relation")
RESERVED = ("id", "group")


def read_metadata_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """Rows of a metadata JSONL file as ``(line number, row)``; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"metadata file '{path}' not found")
    rows: list[tuple[int, dict]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MetadataRowError(lineno, f"invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise MetadataRowError(lineno, "a metadata row must be a JSON object")
            rows.append((lineno, row))
    if not rows:
        raise DataError(f"metadata file '{path}' has no rows")
    return rows


def number_rows(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict]]:
    """In-memory rows numbered from 1, copied so that callers' dicts are left alone."""
    out = []
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise MetadataRowError(i, "a metadata row must be a mapping")
        out.append((i, dict(row)))
    return out


def take(rows: list[tuple[int, dict]], n: int | None, what: str) -> list[tuple[int, dict]]:
    """The first ``n`` rows (all rows when ``n`` is None)."""
    if n is None:
        return rows
    if n > len(rows):
        raise NotEnoughDataError(f"{what} has {len(rows)} rows; {n} relations were requested")
    return rows[:n]


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def check_rows(rows: Sequence[tuple[int, dict]], required: Collection[str]) -> None:
    """Raise :class:`MetadataRowError` for a row lacking a required field or holding a bad value."""
    for lineno, row in rows:
        rid = str(row["id"]) if "id" in row and not _empty(row["id"]) else None
        for f in sorted(required):
            if f not in row or _empty(row[f]):
                raise MetadataRowError(lineno, f"missing or empty required field '{f}'", rid)
            v = row[f]
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise MetadataRowError(
                    lineno, f"field '{f}' must be a string or a number, got {type(v).__name__}", rid
                )
            if isinstance(v, float) and not math.isfinite(v):
                raise MetadataRowError(lineno, f"field '{f}' is not a finite number", rid)


def _ids(rows: Sequence[tuple[int, dict]]) -> list[str]:
    have = [("id" in row and not _empty(row["id"])) for _, row in rows]
    if not any(have):
        width = max(4, len(str(len(rows) - 1)))
        return [f"r{i:0{width}d}" for i in range(len(rows))]
    seen: dict[str, int] = {}
    ids = []
    for (lineno, row), ok in zip(rows, have, strict=True):
        if not ok:
            raise MetadataRowError(lineno, "has no 'id' while other rows do")
        rid = row["id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise MetadataRowError(lineno, "'id' must be a string or an integer")
        rid = str(rid)
        if rid in seen:
            raise MetadataRowError(lineno, f"duplicate id (first used on row {seen[rid]})", rid)
        seen[rid] = lineno
        ids.append(rid)
    return ids


def _groups(rows: Sequence[tuple[int, dict]], fraction: float, seed: int) -> list[str]:
    have = ["group" in row for _, row in rows]
    if all(have):
        for lineno, row in rows:
            if row["group"] not in GROUPS:
                raise MetadataRowError(
                    lineno, f"'group' must be 'task' or 'relation', got {row['group']!r}"
                )
        return [row["group"] for _, row in rows]
    if any(have):
        lineno = next(r[0] for r, h in zip(rows, have, strict=True) if not h)
        raise MetadataRowError(lineno, "has no 'group' while other rows do")
    return assign_groups(len(rows), fraction, seed)


def check_fraction(fraction: float) -> None:
    """Raise :class:`DataError` unless ``0 <= fraction <= 1``."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0.0 <= float(fraction) <= 1.0
    ):
        raise DataError(f"relation fraction must be between 0 and 1, got {fraction!r}")


def assign_groups(n: int, fraction: float, seed: int) -> list[str]:
    """Seeded split of ``n`` relations: ``round(n * fraction)`` get "relation", the rest "task"."""
    check_fraction(fraction)
    k = math.floor(n * float(fraction) + 0.5)
    chosen = set(derive_rng(seed, "groups").sample(range(n), k))
    return ["relation" if i in chosen else "task" for i in range(n)]


def finalize(rows: Sequence[tuple[int, dict]], fraction: float, seed: int) -> list[dict]:
    """Records in output order: ``id``, the row's own fields, then ``group``."""
    ids = _ids(rows)
    groups = _groups(rows, fraction, seed)
    out = []
    for (_, row), rid, group in zip(rows, ids, groups, strict=True):
        rec = {"id": rid}
        rec.update((k, v) for k, v in row.items() if k not in RESERVED)
        rec["group"] = group
        out.append(rec)
    return out
