"""Test prompts: one record per (example, template) with its answer and character spans."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightgraft.data.errors import DatasetError as DatasetError


@dataclass(frozen=True)
class TestPrompt:
    """One test prompt record (``test_prompts.jsonl``)."""

    id: str
    relation_id: str
    template: str
    prompt: str
    answer: str
    spans: dict[str, tuple[int, int]]
    answer_field: str | None = None
    direction: str | None = None
    group: str | None = None
    distractor: str | None = None  # a competing answer (logit difference, CounterFact)


def answer_continuation(answer: str) -> str:
    """The text scored after the prompt: one space, then the answer.

    The answer is what follows the prompt, so whitespace written before it is the separator
    (as the built-in data treats it), never a token to score: ``" Tilda Swinton"`` and
    ``"Tilda Swinton"`` name the same target."""
    return " " + answer.lstrip()


def answer_token_ids(tokenizer: Any, answer: str) -> list[int]:
    """The answer's tokens as every path scores them (run, localize, ``compare``, explore)."""
    return list(tokenizer(answer_continuation(answer), add_special_tokens=False)["input_ids"])


def load_test_prompts(data_dir: Path) -> list[TestPrompt]:
    """Read ``test_prompts.jsonl``; a malformed line is an error naming file and line."""
    path = Path(data_dir) / "test_prompts.jsonl"
    if not path.is_file():
        raise DatasetError(f"{path} does not exist; build a dataset with `weightgraft data build`")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append(
                TestPrompt(
                    id=str(rec["id"]), relation_id=str(rec.get("relation_id", rec["id"])),
                    template=str(rec["template"]), prompt=rec["prompt"], answer=rec["answer"],
                    spans={k: (int(v[0]), int(v[1])) for k, v in rec.get("spans", {}).items()},
                    answer_field=rec.get("answer_field"), direction=rec.get("direction"),
                    group=rec.get("group"), distractor=rec.get("distractor"),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise DatasetError(f"{path}:{n}: not a valid test prompt record ({type(exc).__name__}: {exc})") from exc
    return out
