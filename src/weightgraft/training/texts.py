"""Training texts: one split of a dataset's records, tokenized, padded into batches."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

import torch

from weightgraft.training.errors import TrainingError

SPLITS: tuple[str, ...] = ("relation", "task", "both", "a2b", "b2a")


class TextRecord(TypedDict):
    """One line of a dataset's ``train.jsonl`` / ``validation.jsonl`` (or a supplemental
    ``.jsonl``) as read: its text and the fields a split or a template selects by; any other
    field of the line is kept as written."""

    text: str
    template: NotRequired[str]
    group: NotRequired[str]  # relation | task: splits relation and task
    direction: NotRequired[str]  # a2b | b2a: splits a2b and b2a


def _read_jsonl(path: Path) -> list[TextRecord]:
    if not path.is_file():
        raise TrainingError(
            f"{path} not found: a data directory holds train.jsonl, validation.jsonl and "
            "manifest.json (build one with `weightgraft data build`)"
        )
    records: list[TextRecord] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainingError(f"{path}:{number}: not valid JSON ({exc})") from exc
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise TrainingError(f"{path}:{number}: expected an object with a string 'text'")
            records.append(cast(TextRecord, record))  # its text checked above
    return records


def _keep(record: TextRecord, split: str, path: Path) -> bool:
    if split == "both":
        return True
    field: Literal["direction", "group"] = "direction" if split in ("a2b", "b2a") else "group"
    if field not in record:
        raise TrainingError(
            f"{path}: a record has no '{field}' field, needed for split {split!r} "
            f"(record: {json.dumps(record)[:200]})"
        )
    return record[field] == split


def read_split(
    data_dir: str | os.PathLike[str], split: str, templates: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Texts of the train and validation records of ``split`` (see the module docstring).

    ``templates`` keeps only the training records of those templates (fewer renderings of
    each fact: a cheaper finetune); validation keeps its held-out templates.
    """
    train, validation = split_records(data_dir, split, templates)
    return [r["text"] for r in train], [r["text"] for r in validation]


NO_TEMPLATE = "(no template)"


def train_texts_by_template(
    data_dir: str | os.PathLike[str], split: str, templates: Sequence[str] | None = None,
) -> dict[str, list[str]]:
    """The training texts of ``split`` grouped by their record's ``template`` field (records
    without one under ``NO_TEMPLATE``), in file order."""
    return texts_by_template(split_records(data_dir, split, templates)[0])


def texts_by_template(records: Sequence[TextRecord]) -> dict[str, list[str]]:
    """Texts grouped by their record's ``template`` field, in order."""
    grouped: dict[str, list[str]] = {}
    for record in records:
        grouped.setdefault(str(record.get("template", NO_TEMPLATE)), []).append(record["text"])
    return grouped


def split_records(
    data_dir: str | os.PathLike[str], split: str, templates: Sequence[str] | None = None,
) -> tuple[list[TextRecord], list[TextRecord]]:
    """The train and validation records of ``split`` (:func:`read_split`, whole records)."""
    if split not in SPLITS:
        raise TrainingError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    root = Path(data_dir)
    if not root.is_dir():
        raise TrainingError(f"data directory {root} does not exist")
    out: list[list[TextRecord]] = []
    for name in ("train.jsonl", "validation.jsonl"):
        path = root / name
        records = _read_jsonl(path)
        kept = [r for r in records if _keep(r, split, path)
                and (templates is None or name != "train.jsonl" or r.get("template") in templates)]
        if templates is not None and name == "train.jsonl":
            _check_templates(templates, records, path)
        if not kept:
            groups = sorted({str(r.get("group")) for r in records})
            directions = sorted({str(r.get("direction")) for r in records})
            raise TrainingError(
                f"{path}: no records for split {split!r} ({len(records)} records; groups "
                f"{groups}, directions {directions})"
            )
        out.append(kept)
    return out[0], out[1]


def _check_templates(templates: Sequence[str], records: list[TextRecord], path: Path) -> None:
    if isinstance(templates, str) or not templates:
        raise TrainingError("templates must be a non-empty list of training template names")
    known = sorted({str(r.get("template")) for r in records})
    unknown = [t for t in templates if t not in known]
    if unknown:
        raise TrainingError(f"{path}: no training template {unknown} (it has {', '.join(known)})")


def _read_supplemental(path: Path) -> list[str]:
    """General text: a .jsonl with a 'text' field per line, or plain text, one example a line."""
    if not path.is_file():
        raise TrainingError(f"supplemental text file {path} not found")
    if path.suffix.lower() == ".jsonl":
        texts = [r["text"] for r in _read_jsonl(path)]
    else:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        texts = [t for t in texts if t]
    if not texts:
        raise TrainingError(f"supplemental text file {path} holds no text")
    return texts


class _TokenizedTexts(torch.utils.data.Dataset):
    """Texts tokenized for causal LM training: labels = input ids (padding masked later)."""

    def __init__(self, texts: list[str], tokenizer: Any, max_length: int) -> None:
        self.items: list[dict[str, list[int]]] = []
        eos = tokenizer.eos_token_id
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
            if eos is not None and (not ids or ids[-1] != eos) and len(ids) < max_length:
                ids = ids + [eos]  # teach where an example ends
            self.items.append(
                {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)}
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.items[index]


def _collator(tokenizer: Any) -> Any:
    """Pads a batch on the right; labels are the input ids with padding set to -100 (so the
    loss covers every text token and the closing EOS, even when the pad token is the EOS)."""
    from transformers import DataCollatorForSeq2Seq

    right = copy.copy(tokenizer)
    right.padding_side = "right"  # positions stay 0..n-1 without position_ids
    return DataCollatorForSeq2Seq(right, padding=True, label_pad_token_id=-100, return_tensors="pt")
