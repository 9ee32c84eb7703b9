"""CounterFact from a local file: test prompts (subject span, answer, distractor) and optional
training texts for finetuning the counterfacts in.

Two layouts are read: ROME's records (``requested_rewrite`` with a ``prompt`` holding ``{}``
for the subject, ``subject``, ``target_new`` / ``target_true`` as ``{"str": ...}``) and the
flat tracing layout (``prompt``, ``subject``, ``target_true``, ``target_false``; the prompt
holds the subject or ``{}``). Files are JSON (a list), JSONL or parquet. ``answer="new"``
scores the counterfact (target_new / target_false) against the true object as distractor;
``answer="true"`` the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from weightgraft import atomic
from weightgraft.data.dataset import dumps_jsonl
from weightgraft.data.prompts import DatasetError, TestPrompt
from weightgraft.data.spans import SpanError, resolve_span

Answer = Literal["new", "true"]
TEMPLATE = "counterfact"


@dataclass(frozen=True)
class Fact:
    """One CounterFact case, whatever its layout."""

    id: str
    relation: str
    prompt: str  # with the subject filled in
    subject: str
    target_new: str
    target_true: str
    subject_at: int | None = None  # where ``{}`` put the subject; None for a filled-in prompt


def read_records(path: Path) -> list[tuple[str, Any]]:
    """``(where, record)`` pairs of a JSON, JSONL or parquet file; ``where`` names file and
    record for errors."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"CounterFact file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(path)
        return [(f"{path}:row {i}", rec) for i, rec in enumerate(frame.to_dict(orient="records"))]
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, list):
            raise DatasetError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        return [(f"{path}:record {i}", rec) for i, rec in enumerate(data)]
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not valid JSON ({exc})") from None
    return out


def _target(value: Any, key: str, where: str) -> str:
    if isinstance(value, dict):
        value = value.get("str")
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: {key} must be a string or {{\"str\": ...}}, got {value!r}")
    return value.strip()


def _fill(prompt: Any, subject: Any, where: str) -> tuple[str, int | None]:
    """The prompt with the subject in place of ``{}``, and where it was put (the subject's
    span comes from there, not from searching the filled prompt, where it may recur)."""
    if not isinstance(prompt, str) or not isinstance(subject, str) or not subject:
        raise DatasetError(f"{where}: prompt and subject must be strings")
    at = prompt.find("{}")
    return (prompt[:at] + subject + prompt[at + 2:], at) if at >= 0 else (prompt, None)


def parse_fact(rec: Any, where: str, index: int) -> Fact:
    """One record of either layout as a ``Fact``."""
    if not isinstance(rec, dict):
        raise DatasetError(f"{where}: expected an object, got {type(rec).__name__}")
    case = str(rec.get("case_id", rec.get("known_id", index)))
    if "requested_rewrite" in rec:
        rw = rec["requested_rewrite"]
        if not isinstance(rw, dict):
            raise DatasetError(f"{where}: requested_rewrite must be an object")
        missing = [k for k in ("prompt", "subject", "target_new", "target_true") if k not in rw]
        if missing:
            raise DatasetError(f"{where}: requested_rewrite lacks {missing}")
        prompt, at = _fill(rw["prompt"], rw["subject"], where)
        return Fact(case, str(rw.get("relation_id", "")), prompt,
                    rw["subject"], _target(rw["target_new"], "target_new", where),
                    _target(rw["target_true"], "target_true", where), at)
    missing = [k for k in ("prompt", "subject", "target_true", "target_false") if k not in rec]
    if missing:
        raise DatasetError(
            f"{where}: neither ROME's layout (requested_rewrite) nor the flat one: lacks {missing}"
        )
    prompt, at = _fill(rec["prompt"], rec["subject"], where)
    return Fact(case, str(rec.get("relation_id", rec.get("relation", ""))), prompt,
                rec["subject"], _target(rec["target_false"], "target_false", where),
                _target(rec["target_true"], "target_true", where), at)


def to_test_prompt(fact: Fact, where: str, answer: Answer) -> TestPrompt:
    """The fact as a test prompt: subject span, answer and distractor."""
    try:
        span = (resolve_span(fact.prompt, "subject", fact.subject) if fact.subject_at is None
                else (fact.subject_at, fact.subject_at + len(fact.subject)))
    except SpanError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    new, true = fact.target_new, fact.target_true
    return TestPrompt(
        id=fact.id, relation_id=fact.relation or fact.id, template=TEMPLATE, prompt=fact.prompt,
        answer=new if answer == "new" else true, spans={"subject": span},
        distractor=true if answer == "new" else new, group=fact.relation or None,
    )


def _prompt_record(p: TestPrompt) -> dict[str, Any]:
    return {"id": p.id, "relation_id": p.relation_id, "template": p.template, "prompt": p.prompt,
            "answer": p.answer, "distractor": p.distractor, "spans": {k: list(v) for k, v in p.spans.items()},
            "group": p.group}


def convert(path: Path, out: Path, answer: Answer = "new", train_texts: bool = False,
            limit: int | None = None) -> dict[str, int]:
    """Write ``test_prompts.jsonl`` (and with ``train_texts`` ``train.jsonl`` and
    ``validation.jsonl`` holding prompt + answer, the format ``weightgraft train`` reads) into
    ``out``; every record is converted or the conversion fails naming it."""
    if answer not in ("new", "true"):
        raise DatasetError(f"answer must be 'new' or 'true', got {answer!r}")
    records = read_records(path)
    if limit is not None:
        records = records[:limit]
    if not records:
        raise DatasetError(f"{path} holds no record")
    prompts, seen = [], {}
    for i, (where, rec) in enumerate(records):
        p = to_test_prompt(parse_fact(rec, where, i), where, answer)
        if p.id in seen:
            raise DatasetError(f"{where}: case id {p.id!r} repeats {seen[p.id]}")
        seen[p.id] = where
        prompts.append(p)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(out / "test_prompts.jsonl", dumps_jsonl([_prompt_record(p) for p in prompts]))
    counts = {"test_prompts": len(prompts)}
    if train_texts:
        texts = [{"text": f"{p.prompt} {p.answer}", "id": p.id, "group": "relation", "direction": "a2b"}
                 for p in prompts]
        atomic.write_bytes(out / "train.jsonl", dumps_jsonl(texts))
        # the facts themselves: finetuning them in is memorisation, checked on what was taught
        atomic.write_bytes(out / "validation.jsonl", dumps_jsonl(texts))
        counts["train"] = len(texts)
    return counts
