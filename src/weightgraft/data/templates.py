"""Text templates: parsing, rendering with character spans, and YAML template sets.

Template syntax (the YAML files under ``weightgraft/data/templates/`` use it):

* ``{field}`` is replaced by the value of a metadata field;
* ``{=label:literal text}`` writes ``literal text`` and records its character span under
  ``label`` (e.g. ``{=relation:starred in a movie}``, ``{=preposition:with}``);
* ``{{`` and ``}}`` write literal braces.

A template set file holds the training templates (``kind`` article / qa / ...), the names
of those held out for validation, the test templates (each with the ``answer`` field that
completes it) and the pair of fields that a B2A (reversed) rendering swaps.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import TemplateError, TemplateFieldError

_TOKEN = re.compile(
    r"\{\{|\}\}"
    r"|\{=(?P<mark>[A-Za-z_]\w*):(?P<text>[^{}]*)\}"
    r"|\{(?P<field>[A-Za-z_]\w*)\}"
    r"|[{}]"
)
_NAME = re.compile(r"^[A-Za-z_][\w\-]*$")


@dataclass(frozen=True)
class Literal:
    """Plain text copied into the output."""

    text: str


@dataclass(frozen=True)
class Field:
    """A placeholder replaced by a metadata value."""

    name: str


@dataclass(frozen=True)
class Mark:
    """Literal text whose span is recorded under ``name``."""

    name: str
    text: str


Part = Literal | Field | Mark


@dataclass(frozen=True)
class Rendered:
    """A rendered template: the text and the [start, end) span of every field and mark."""

    text: str
    spans: dict[str, tuple[int, int]]


def format_value(value: Any) -> str:
    """Turn a metadata value into the text written into a template."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"cannot write {type(value).__name__} value {value!r} into a template")
    return str(value)


def parse_template(name: str, text: str) -> tuple[Part, ...]:
    """Split template ``text`` into literal, field and mark parts."""
    if not isinstance(text, str) or not text:
        raise TemplateError(f"template '{name}' is empty or not a string")
    parts: list[Part] = []
    buf: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        buf.append(text[pos : m.start()])
        pos = m.end()
        tok = m.group(0)
        if tok in ("{{", "}}"):
            buf.append(tok[0])
            continue
        if m.group("mark") is None and m.group("field") is None:
            raise TemplateError(
                f"template '{name}': unmatched '{tok}' at character {m.start()} "
                f"(write '{tok}{tok}' for a literal brace)"
            )
        if buf:
            parts.append(Literal("".join(buf)))
            buf = []
        if m.group("mark") is not None:
            if not m.group("text"):
                raise TemplateError(f"template '{name}': mark '{m.group('mark')}' has no text")
            parts.append(Mark(m.group("mark"), m.group("text")))
        else:
            parts.append(Field(m.group("field")))
    buf.append(text[pos:])
    if "".join(buf):
        parts.append(Literal("".join(buf)))
    fields = {p.name for p in parts if isinstance(p, Field)}
    clash = sorted(fields & {p.name for p in parts if isinstance(p, Mark)})
    if clash:
        raise TemplateError(f"template '{name}': '{clash[0]}' is used both as a field and a mark")
    return tuple(parts)


@dataclass(frozen=True)
class Template:
    """One named template. ``answer`` is set for test templates only."""

    name: str
    kind: str
    text: str
    answer: str | None = None
    parts: tuple[Part, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def parse(cls, name: str, text: str, kind: str, answer: str | None = None) -> Template:
        """Parse ``text`` into a template, checking its syntax."""
        return cls(name=name, kind=kind, text=text, answer=answer, parts=parse_template(name, text))

    @property
    def fields(self) -> tuple[str, ...]:
        """Field names in order of first use."""
        return tuple(dict.fromkeys(p.name for p in self.parts if isinstance(p, Field)))

    @property
    def marks(self) -> tuple[str, ...]:
        """Mark labels in order of first use."""
        return tuple(dict.fromkeys(p.name for p in self.parts if isinstance(p, Mark)))

    def render(self, values: Mapping[str, Any]) -> Rendered:
        """Fill the template from ``values`` (field -> value); spans are [start, end)."""
        out: list[str] = []
        spans: dict[str, tuple[int, int]] = {}
        length = 0
        for part in self.parts:
            if isinstance(part, Literal):
                piece = part.text
            elif isinstance(part, Mark):
                piece = part.text
                spans.setdefault(part.name, (length, length + len(piece)))
            else:
                try:
                    piece = format_value(values[part.name])
                except KeyError:
                    raise TemplateFieldError(part.name, self.name) from None
                spans.setdefault(part.name, (length, length + len(piece)))
            out.append(piece)
            length += len(piece)
        return Rendered("".join(out), spans)


@dataclass(frozen=True)
class TemplateSet:
    """Training, validation and test templates of one world family."""

    name: str
    source: str
    train: tuple[Template, ...]
    test: tuple[Template, ...]
    validation: tuple[str, ...] = ()
    swap: tuple[str, str] | None = None
    sha256: str = ""

    @property
    def train_templates(self) -> tuple[Template, ...]:
        """Training templates that are not held out for validation."""
        return tuple(t for t in self.train if t.name not in self.validation)

    @property
    def validation_templates(self) -> tuple[Template, ...]:
        """Training templates held out as validation rephrasings."""
        return tuple(t for t in self.train if t.name in self.validation)

    def fields(self) -> set[str]:
        """Every metadata field the templates need (including answers and swap fields)."""
        needed = {f for t in (*self.train, *self.test) for f in t.fields}
        needed |= {t.answer for t in self.test if t.answer}
        needed |= set(self.swap or ())
        return needed

    def check_fields(self, available: Collection[str]) -> None:
        """Raise :class:`TemplateFieldError` for the first template field not in ``available``."""
        have = set(available)
        for t in (*self.train, *self.test):
            for f in (*t.fields, *([t.answer] if t.answer else [])):
                if f not in have:
                    raise TemplateFieldError(f, t.name, self.source)
        for f in self.swap or ():
            if f not in have:
                raise TemplateFieldError(f, "swap", self.source)

    def with_validation(self, names: Iterable[str]) -> TemplateSet:
        """A copy holding out ``names`` (training template names) for validation."""
        names = tuple(dict.fromkeys(names))
        _check_validation(names, self.train, self.source)
        return replace(self, validation=names)


def _check_validation(names: tuple[str, ...], train: tuple[Template, ...], source: str) -> None:
    known = [t.name for t in train]
    for n in names:
        if n not in known:
            raise TemplateError(
                f"{source}: validation template '{n}' is not a training template "
                f"(known: {', '.join(known)})"
            )
    if len(set(names)) >= len(known):
        raise TemplateError(f"{source}: every training template is held out for validation")


def _require_mapping(obj: Any, what: str, source: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise TemplateError(f"{source}: {what} must be a mapping, got {type(obj).__name__}")
    return obj


def _entries(doc: Mapping[str, Any], key: str, source: str, allowed: set[str]) -> list[dict]:
    items = doc.get(key)
    if not isinstance(items, list) or not items:
        raise TemplateError(f"{source}: '{key}' must be a non-empty list of templates")
    out = []
    for i, item in enumerate(items):
        item = _require_mapping(item, f"{key}[{i}]", source)
        unknown = sorted(set(item) - allowed)
        if unknown:
            raise TemplateError(f"{source}: {key}[{i}] has unknown key '{unknown[0]}'")
        name = item.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise TemplateError(f"{source}: {key}[{i}] needs a 'name' (letters, digits, _ or -)")
        out.append(dict(item))
    return out


def template_set_from_dict(doc: Any, source: str, sha256: str = "") -> TemplateSet:
    """Build a :class:`TemplateSet` from a parsed YAML document."""
    doc = _require_mapping(doc, "the template file", source)
    unknown = sorted(set(doc) - {"name", "description", "swap", "validation", "train", "test"})
    if unknown:
        raise TemplateError(f"{source}: unknown top-level key '{unknown[0]}'")
    train: list[Template] = []
    for e in _entries(doc, "train", source, {"name", "kind", "template"}):
        kind = e.get("kind")
        if not isinstance(kind, str) or not _NAME.match(kind):
            raise TemplateError(f"{source}: training template '{e['name']}' needs a 'kind'")
        train.append(Template.parse(e["name"], e.get("template"), kind))
    test: list[Template] = []
    for e in _entries(doc, "test", source, {"name", "template", "answer"}):
        t = Template.parse(e["name"], e.get("template"), "test", e.get("answer"))
        _check_test_template(t, source)
        test.append(t)
    names = [t.name for t in (*train, *test)]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise TemplateError(f"{source}: template name '{dup}' is used twice")
    swap = doc.get("swap")
    if swap is not None:
        if (
            not isinstance(swap, list)
            or len(swap) != 2
            or not all(isinstance(s, str) for s in swap)
            or swap[0] == swap[1]
        ):
            raise TemplateError(f"{source}: 'swap' must list two different field names")
        swap = (swap[0], swap[1])
    validation = doc.get("validation") or []
    if not isinstance(validation, list) or not all(isinstance(v, str) for v in validation):
        raise TemplateError(f"{source}: 'validation' must be a list of training template names")
    validation_t = tuple(dict.fromkeys(validation))
    _check_validation(validation_t, tuple(train), source)
    return TemplateSet(
        name=str(doc.get("name") or Path(source).stem),
        source=source,
        train=tuple(train),
        test=tuple(test),
        validation=validation_t,
        swap=swap,
        sha256=sha256,
    )


def _check_test_template(t: Template, source: str) -> None:
    if not isinstance(t.answer, str) or not t.answer:
        raise TemplateError(f"{source}: test template '{t.name}' needs an 'answer' field name")
    if t.answer in t.fields:
        raise TemplateError(
            f"{source}: test template '{t.name}' writes its answer field '{t.answer}' "
            "into the prompt"
        )
    if not t.fields:
        raise TemplateError(f"{source}: test template '{t.name}' uses no field")
    if t.text != t.text.rstrip():
        raise TemplateError(
            f"{source}: test template '{t.name}' ends with whitespace "
            "(the target is ' ' + answer, so the prompt must not end with a space)"
        )


def load_template_text(text: str, source: str) -> TemplateSet:
    """Parse a YAML template set given as text; ``source`` names it in errors."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TemplateError(f"{source}: invalid YAML: {exc}") from None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return template_set_from_dict(doc, source, digest)


def builtin_template_names() -> list[str]:
    """Names of the template sets shipped with weightgraft."""
    folder = resources.files("weightgraft.data") / "templates"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_templates(path_or_name: str | Path) -> TemplateSet:
    """Load a template set from a YAML file path or a built-in name (e.g. ``"movies"``)."""
    path = Path(path_or_name)
    if path.is_file():
        return load_template_text(path.read_text(encoding="utf-8"), path.name)
    name = str(path_or_name)
    if name in builtin_template_names():
        res = resources.files("weightgraft.data") / "templates" / f"{name}.yaml"
        return load_template_text(res.read_text(encoding="utf-8"), f"builtin:{name}.yaml")
    raise TemplateError(
        f"template file '{path_or_name}' not found "
        f"(built-in template sets: {', '.join(builtin_template_names())})"
    )
