"""``build_dataset``: world or custom metadata + templates -> a seeded, validated Dataset."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from . import metadata as md
from .dataset import Dataset, file_entries, sha256
from .errors import DataError
from .render import (
    Progress,
    check_unambiguous,
    parse_directions,
    test_prompts,
    training_lines,
)
from .shuffle import answer_field, shuffle_answers
from .templates import TemplateSet, load_templates
from .worlds import WORLDS, check_distinct_entities, get_world

DEFAULT_N = 1000
FORMAT = "weightgraft.relations/1"


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("weightgraft", "Faker", "PyYAML"):
        try:
            out[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            out[dist] = "unknown"
    out["python"] = platform.python_version()
    return out


def _check_int(name: str, value: Any, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise DataError(f"{name} must be at least {minimum}, got {value}")


def _templates(world: str, templates: str | Path | None) -> TemplateSet:
    if templates is not None:
        return load_templates(templates)
    if world in WORLDS:
        return load_templates(WORLDS[world].templates)
    get_world(world)  # raises UnknownWorldError with the list of worlds
    raise AssertionError("unreachable")


def _rows(
    world: str, n: int | None, seed: int, metadata: str | Path | Sequence[Mapping] | None
) -> tuple[list[tuple[int, dict]], dict[str, Any]]:
    """Metadata rows (numbered) and a description of where they came from."""
    if metadata is None:
        spec = get_world(world)
        rows = md.number_rows(spec.generate(DEFAULT_N if n is None else n, seed))
        return rows, {"generator": spec.name}
    if isinstance(metadata, (str, Path)):
        path = Path(metadata)
        rows = md.read_metadata_jsonl(path)
        source = {"file": path.name, "sha256": sha256(path.read_bytes())}
        return md.take(rows, n, f"metadata file '{path.name}'"), source
    rows = md.number_rows(list(metadata))
    return md.take(rows, n, "the metadata"), {"records": len(rows)}


def build_dataset(
    world: str,
    n: int | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    *,
    directions: str = "both",
    test_directions: str = "both",
    relation_fraction: float = 0.5,
    metadata: str | Path | Sequence[Mapping] | None = None,
    templates: str | Path | None = None,
    validation_templates: Sequence[str] | None = None,
    shuffled_answers: bool = False,
    progress: Progress | None = None,
) -> Dataset:
    """Build (and, if ``out`` is given, write) a relation dataset.

    ``world`` names a built-in world (see :func:`list_worlds`) whose metadata is generated
    with ``seed``, or any name for a custom world given by ``metadata`` (JSONL path or
    records) and ``templates`` (YAML path or built-in template set name). ``n`` defaults to
    1,000 for generated worlds and to every row for custom metadata. ``directions`` picks
    the training renderings (``a2b``, ``b2a``, ``both``), ``test_directions`` the test
    prompts. ``relation_fraction`` of the relations get group "relation", the rest "task"
    (custom rows that all carry a ``group`` keep it).
    ``validation_templates`` overrides the held-out training templates of the template set.
    ``shuffled_answers`` renders the training and validation text with each relation's answer
    entity taken from another relation (a derangement seeded by ``seed``, recorded in the
    manifest's ``shuffled_answers``); metadata and test prompts keep the true answers.
    """
    _check_int("seed", seed)
    if n is not None:
        _check_int("n", n, minimum=1)
    md.check_fraction(relation_fraction)
    train_dirs = parse_directions(directions)
    test_dirs = parse_directions(test_directions)
    tset = _templates(world, templates)
    if validation_templates is not None:
        tset = tset.with_validation(validation_templates)
    if tset.swap is None and "b2a" in (*train_dirs, *test_dirs):
        raise DataError(
            f"{tset.source} has no 'swap' pair of fields, so direction 'b2a' is not available "
            "(use a2b directions or add 'swap: [field_a, field_b]')"
        )

    rows, source = _rows(world, n, seed, metadata)
    if progress:
        progress("metadata", len(rows), len(rows))
    tset.check_fields({k for _, row in rows for k in row})
    md.check_rows(rows, tset.fields())
    records = md.finalize(rows, relation_fraction, seed)
    if metadata is None and tset.swap:
        check_distinct_entities(records, tset.swap)

    shuffle = None
    taught = records
    if shuffled_answers:
        taught, shuffle = shuffle_answers(records, answer_field(tset), seed)
    train, validation = training_lines(taught, tset, train_dirs, progress)
    prompts = test_prompts(records, tset, test_dirs, progress)
    check_unambiguous(prompts)

    ds = Dataset(
        world=world,
        seed=seed,
        metadata=records,
        train=train,
        validation=validation,
        test_prompts=prompts,
    )
    ds.manifest = {
        "format": FORMAT,
        "world": world,
        "custom": metadata is not None or templates is not None,
        "seed": seed,
        "n": len(records),
        "directions": list(train_dirs),
        "test_directions": list(test_dirs),
        "relation_fraction": relation_fraction,
        "groups": {g: sum(r["group"] == g for r in records) for g in md.GROUPS},
        "metadata_source": source,
        "shuffled_answers": shuffle,
        "templates": {
            "source": tset.source,
            "sha256": tset.sha256,
            "swap": list(tset.swap) if tset.swap else None,
            "train": [t.name for t in tset.train_templates],
            "validation": [t.name for t in tset.validation_templates],
            "test": [t.name for t in tset.test],
        },
        "counts": {
            "relations": len(records),
            "train": len(train),
            "validation": len(validation),
            "test_prompts": len(prompts),
        },
        "versions": _versions(),
    }
    files = ds.to_bytes()
    ds.manifest["files"] = file_entries(files)
    if out is not None:
        ds.write(out, files)
        if progress:
            progress("write", 1, 1)
    return ds
