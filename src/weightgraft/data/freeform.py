"""Free-form prompt files: a JSONL a researcher writes by hand, one question per line.

``{"prompt": ..., "answer": ..., "spans": {"subject": "Eiffel Tower"}, "distractor": ...,
"id": ..., "group": ..., "template": ...}``: spans are substrings of the prompt (first
occurrence) or ``[start, end]`` characters. Every problem is an error naming file, line and
field; no record is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weightgraft.data.prompts import DatasetError, TestPrompt, load_test_prompts
from weightgraft.data.spans import SpanError, resolve_spans

FIELDS = frozenset({"prompt", "answer", "spans", "distractor", "id", "group", "template", "relation_id"})
DEFAULT_TEMPLATE = "freeform"


def _text(rec: dict[str, Any], key: str, where: str, required: bool) -> str | None:
    value = rec.get(key)
    if value is None:
        if required:
            raise DatasetError(f"{where}: missing {key!r}")
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key in ("id", "group"):
        return str(value)
    if not isinstance(value, str) or (required and not value.strip()):
        raise DatasetError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


def parse_record(rec: Any, where: str, default_id: str) -> TestPrompt:
    """One free-form record as a ``TestPrompt``; ``where`` is ``file:line`` for errors."""
    if not isinstance(rec, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    unknown = sorted(set(rec) - FIELDS)
    if unknown:
        raise DatasetError(f"{where}: unknown field(s) {unknown}; a record has {sorted(FIELDS)}")
    prompt = _text(rec, "prompt", where, True)
    answer = _text(rec, "answer", where, True)
    spans = rec.get("spans") or {}
    if not isinstance(spans, dict):
        raise DatasetError(f"{where}: 'spans' must map span names to substrings or [start, end]")
    try:
        resolved = resolve_spans(prompt, spans)
    except SpanError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    ex_id = _text(rec, "id", where, False) or default_id
    return TestPrompt(
        id=ex_id, relation_id=_text(rec, "relation_id", where, False) or ex_id,
        template=_text(rec, "template", where, False) or DEFAULT_TEMPLATE,
        prompt=prompt, answer=answer, spans=resolved, group=_text(rec, "group", where, False),
        distractor=_text(rec, "distractor", where, False),
    )


def read_freeform(path: Path) -> list[TestPrompt]:
    """Every record of a free-form JSONL; ids must be unique per template."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"prompt file {path} does not exist")
    out: list[TestPrompt] = []
    seen: dict[tuple[str, str], int] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc})") from None
        prompt = parse_record(rec, where, default_id=f"line{n}")
        key = (prompt.template, prompt.id)
        if key in seen:
            raise DatasetError(f"{where}: id {prompt.id!r} already used on line {seen[key]} (template {prompt.template!r})")
        seen[key] = n
        out.append(prompt)
    if not out:
        raise DatasetError(f"{path} holds no prompt")
    return out


def load_prompts(data: Path) -> list[TestPrompt]:
    """Test prompts from a dataset folder (``test_prompts.jsonl``) or a free-form ``.jsonl``."""
    data = Path(data)
    if data.name == "test_prompts.jsonl":
        return load_test_prompts(data.parent)
    if data.suffix == ".jsonl" or data.is_file():
        return read_freeform(data)
    return load_test_prompts(data)
