"""The :class:`Dataset` object, its byte-stable JSONL files and ``manifest.json``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from weightgraft import atomic
from weightgraft.resume.manifests import Json

from .errors import DataError

SPLITS = ("metadata", "train", "validation", "test_prompts")
MANIFEST = "manifest.json"


def dumps_jsonl(records: list[dict]) -> bytes:
    """One JSON object per line, UTF-8, keys in record order, ``\\n`` line ends."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


@dataclass
class Dataset:
    """A relation dataset: metadata records, training / validation lines and test prompts.

    Record formats are documented in ``weightgraft.data`` (module docstring).
    """

    world: str
    seed: int
    metadata: list[dict]
    train: list[dict]
    validation: list[dict]
    test_prompts: list[dict]
    manifest: Json = field(default_factory=dict)  # manifest.json as built: world, seed, counts, files, ...

    def split(self, name: str) -> list[dict]:
        """Records of split ``name`` (one of metadata, train, validation, test_prompts)."""
        if name not in SPLITS:
            raise DataError(f"unknown split '{name}' (splits: {', '.join(SPLITS)})")
        return getattr(self, name)

    def select(self, split: str, **where: Any) -> list[dict]:
        """Records of ``split`` whose fields equal every ``where`` value.

        A tuple, list or set value matches any of its members.
        """
        def ok(rec: dict) -> bool:
            for k, v in where.items():
                if isinstance(v, (tuple, list, set, frozenset)):
                    if rec.get(k) not in v:
                        return False
                elif rec.get(k) != v:
                    return False
            return True

        return [r for r in self.split(split) if ok(r)]

    def relation_ids(self, group: str | None = None) -> list[str]:
        """Ids of the relations (optionally of one group), in metadata order."""
        return [r["id"] for r in self.metadata if group is None or r["group"] == group]

    def to_bytes(self) -> dict[str, bytes]:
        """The four JSONL files as bytes, keyed by file name."""
        return {f"{s}.jsonl": dumps_jsonl(self.split(s)) for s in SPLITS}

    def write(self, out: str | Path, files: dict[str, bytes] | None = None) -> Path:
        """Write the JSONL files (``files``: precomputed :meth:`to_bytes`) and ``manifest.json``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, data in (files or self.to_bytes()).items():
            atomic.write_bytes(out / name, data)
        atomic.write_bytes(out / MANIFEST, manifest_bytes(self.manifest))  # last: marks a whole dataset
        return out


def manifest_bytes(manifest: Json) -> bytes:
    """``manifest.json`` content: indented JSON with a trailing newline."""
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


class FileEntry(TypedDict):
    """A dataset file in its manifest: line count and SHA-256."""

    lines: int
    sha256: str


def file_entries(files: dict[str, bytes]) -> dict[str, FileEntry]:
    """Line count and SHA-256 of each file."""
    return {name: FileEntry(lines=data.count(b"\n"), sha256=sha256(data)) for name, data in files.items()}


def load_dataset(path: str | Path, verify: bool = True) -> Dataset:
    """Read a dataset directory written by ``build_dataset``; ``verify`` checks the SHA-256s."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise DataError(f"'{path}' is not a dataset directory (no {MANIFEST})")
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    splits: dict[str, list[dict]] = {}
    for s in SPLITS:
        fpath = path / f"{s}.jsonl"
        if not fpath.is_file():
            raise DataError(f"dataset '{path}' has no {fpath.name}")
        data = fpath.read_bytes()
        expected = manifest.get("files", {}).get(fpath.name, {}).get("sha256")
        if verify and expected != sha256(data):
            raise DataError(f"{fpath} does not match the SHA-256 in {MANIFEST}")
        splits[s] = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    return Dataset(
        world=manifest.get("world", ""),
        seed=manifest.get("seed", 0),
        manifest=manifest,
        **splits,
    )
