"""Rendering metadata records into training lines and test prompts, in A2B or B2A direction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .errors import AmbiguousPromptError, DataError
from .templates import Template, TemplateSet, format_value

DIRECTIONS = ("a2b", "b2a")
Progress = Callable[[str, int, int], None]


def parse_directions(value: str) -> tuple[str, ...]:
    """``"a2b"``, ``"b2a"`` or ``"both"`` as a tuple of directions."""
    if value == "both":
        return DIRECTIONS
    if value in DIRECTIONS:
        return (value,)
    raise DataError(f"directions must be 'a2b', 'b2a' or 'both', got {value!r}")


def oriented(
    record: dict, direction: str, swap: tuple[str, str] | None
) -> tuple[dict, dict[str, str]]:
    """The record as seen by a template in ``direction`` and the map template field -> record field.

    B2A exchanges the two ``swap`` fields: ``{first_actor}`` then writes the second actor.
    """
    if direction == "a2b":
        return record, {}
    if swap is None:
        raise DataError("direction 'b2a' needs a template set with a 'swap' pair of fields")
    a, b = swap
    view = dict(record)
    view[a], view[b] = record[b], record[a]
    return view, {a: b, b: a}


def _lines(
    records: Sequence[dict],
    templates: Sequence[Template],
    directions: Sequence[str],
    swap: tuple[str, str] | None,
    stage: str,
    progress: Progress | None,
) -> list[dict]:
    out = []
    for i, rec in enumerate(records):
        for d in directions:
            view, _ = oriented(rec, d, swap)
            for t in templates:
                out.append(
                    {
                        "text": t.render(view).text,
                        "relation_id": rec["id"],
                        "template": t.name,
                        "kind": t.kind,
                        "direction": d,
                        "group": rec["group"],
                    }
                )
        if progress and (i + 1) % 256 == 0:
            progress(stage, i + 1, len(records))
    if progress:
        progress(stage, len(records), len(records))
    return out


def training_lines(
    records: Sequence[dict],
    tset: TemplateSet,
    directions: Sequence[str],
    progress: Progress | None = None,
) -> tuple[list[dict], list[dict]]:
    """``(train, validation)`` lines: every record x direction x (held-in | held-out) template."""
    train = _lines(records, tset.train_templates, directions, tset.swap, "train", progress)
    val = _lines(records, tset.validation_templates, directions, tset.swap, "validation", progress)
    return train, val


def prompt_record(
    rec: dict, t: Template, direction: str, swap: tuple[str, str] | None
) -> dict[str, Any]:
    """One test prompt: the rendered prompt, its answer and the spans of its fields and marks."""
    view, rename = oriented(rec, direction, swap)
    r = t.render(view)
    suffix = "" if direction == "a2b" else f"/{direction}"
    return {
        "id": f"{rec['id']}/{t.name}{suffix}",
        "relation_id": rec["id"],
        "template": t.name,
        "direction": direction,
        "prompt": r.text,
        "answer": format_value(view[t.answer]),
        "answer_field": rename.get(t.answer, t.answer),
        "spans": {rename.get(k, k): [s, e] for k, (s, e) in r.spans.items()},
        "group": rec["group"],
    }


def test_prompts(
    records: Sequence[dict],
    tset: TemplateSet,
    directions: Sequence[str],
    progress: Progress | None = None,
) -> list[dict]:
    """Every record x test template x direction as a test prompt."""
    out = []
    for i, rec in enumerate(records):
        for t in tset.test:
            for d in directions:
                out.append(prompt_record(rec, t, d, tset.swap))
        if progress and (i + 1) % 256 == 0:
            progress("test", i + 1, len(records))
    if progress:
        progress("test", len(records), len(records))
    return out


def check_unambiguous(prompts: Sequence[dict]) -> None:
    """Raise :class:`AmbiguousPromptError` if one prompt text has two different answers."""
    first: dict[str, dict] = {}
    for p in prompts:
        seen = first.setdefault(p["prompt"], p)
        if seen["answer"] != p["answer"]:
            raise AmbiguousPromptError(
                f"test prompt {p['prompt']!r} has two answers: {seen['answer']!r} "
                f"({seen['id']}) and {p['answer']!r} ({p['id']}); make the entity that "
                "the prompt names unique across relations"
            )
