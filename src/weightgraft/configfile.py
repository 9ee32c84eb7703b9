"""Config files as every command reads them: a YAML with ``key=value`` overrides, relative paths
taken from the file's folder, one :class:`ConfigError` line for a file that cannot be read, and
the digest of a config's settings that names its results folder.

Why here, below ``experiments`` and ``localization``: both read configs this way, and neither
should borrow it from the other.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from weightgraft.data.prompts import DatasetError, TestPrompt
from weightgraft.errors import WeightgraftError, validation_line
from weightgraft.models.spec import ModelSpec, parse_spec, spec_error_of
from weightgraft.resume.manifests import Json

__all__ = ["ConfigError", "RunInputs", "anchor_paths", "apply_overrides", "json_digest", "read_yaml_config"]


class ConfigError(WeightgraftError, ValueError):
    """A broken config; the message names the path of the bad key."""


def json_digest(data: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the sha256 of ``data`` as sorted JSON (what names a
    run's identity and its stage files: the same settings, the same digest)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:length]


def _set_path(tree: Json, dotted: str, value: Any) -> None:
    node: Any = tree
    keys = dotted.split(".")
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[int(key)]
        else:
            node = node.setdefault(key, {})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def apply_overrides(raw: Json, overrides: list[str]) -> Json:
    """``a.b=value`` (value parsed as YAML) onto a raw config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. limit=10)")
        key, value = item.split("=", 1)
        try:
            _set_path(raw, key.strip(), yaml.safe_load(value))
        except (IndexError, ValueError, TypeError) as exc:
            raise ConfigError(f"cannot apply override {item!r}: {exc}") from exc
    return raw


def _anchor(value: Any, folder: Path, must_exist: bool) -> Any:
    """A relative path written in a YAML, taken from the YAML's folder (a model spec only
    when it names something there: it may also be an embedded name or a hub id)."""
    spec = _spec_or_none(value)
    anchored_spec = spec.anchored(folder) if spec is not None else None
    if anchored_spec is not None:  # peft(ROLE, DIR), checkpoint(DIR, step=K): its DIR
        return anchored_spec
    if not isinstance(value, str) or not value or Path(value).is_absolute() or "(" in value:
        return value
    anchored = folder / value
    if not must_exist or anchored.exists():
        return os.path.normpath(anchored)  # docs/x/../../runs/y is shown as runs/y
    return value


def _spec_or_none(value: Any) -> ModelSpec | None:
    """``value`` as a model spec, None where it is none (a malformed one is refused when the
    config is validated, with its field path)."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return parse_spec(value)
    except ValueError:
        return None


def anchor_paths(raw: Json, folder: Path) -> Json:
    """``data``, ``out`` and model directories of a raw config, relative to ``folder``."""
    for key in ("data", "out"):
        if key in raw:
            raw[key] = _anchor(raw[key], folder, must_exist=False)
    if "tokenizer" in raw:  # a directory there, else a name ("bytes", an embedded model)
        raw["tokenizer"] = _anchor(raw["tokenizer"], folder, must_exist=True)
    model_sets = raw.get("model_sets")
    for roles in [raw.get("models"), *(model_sets.values() if isinstance(model_sets, dict) else [])]:
        if isinstance(roles, dict):
            for role, spec in roles.items():
                if isinstance(spec, str):
                    roles[role] = _anchor(spec, folder, must_exist=True)
                elif isinstance(spec, list):
                    roles[role] = [_anchor(x, folder, must_exist=True) for x in spec]
    return raw


def read_yaml_config(path: Path, overrides: list[str] | None = None, what: str = "experiment") -> Json:
    """A config YAML as a raw dict with ``key=value`` overrides applied (validated by the caller).

    Relative paths in the file (``data``, ``out``, model directories) are taken from the
    file's folder, so a config runs the same from any working directory; override values are
    taken as typed, from the working directory."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} config {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if isinstance(raw, dict):
        anchor_paths(raw, path.parent)
    return apply_overrides(raw, overrides or [])


def _json_default(kind: type[BaseModel], key: str) -> Any:
    """A field's default as its JSON value."""
    field = kind.model_fields[key]
    value = field.get_default(call_default_factory=True)
    return json.loads(json.dumps(value.model_dump(mode="json") if isinstance(value, BaseModel) else value, default=str))


class RunInputs(BaseModel):
    """What every pipeline's config reads the same way (``weightgraft run`` and ``localize``
    extend it): the dataset, which of its prompts (templates, directions, at most ``limit`` per
    template), the device, the seed, the tokenizer of models that have none, where results go."""

    model_config = ConfigDict(extra="forbid")
    what: ClassVar[str] = "run"  # the kind of config, as its messages name it

    data: Path
    templates: list[str] | None = None
    directions: list[Literal["a2b", "b2a"]] | None = None
    limit: int | None = Field(None, ge=1, description="max examples per template")
    device: str = "cpu"
    # The tokenizer of models that have none (random:NAME): "bytes", an embedded model's name,
    # or a tokenizer directory; its vocabulary must fit every model's.
    tokenizer: str | None = None
    seed: int = 0
    name: str = "run"
    out: Path | None = None
    report: bool = True

    @classmethod
    def parse(cls, raw: Any, source: str = "<dict>", base_dir: Path | None = None) -> Self:
        """Validate a raw dict into this kind of config, refused in one line that names the path
        of each bad key; relative ``data`` and ``out`` are taken from ``base_dir``."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: a{'n' if cls.what[0] in 'aeiou' else ''} {cls.what} config must be a "
                              f"mapping, got {type(raw).__name__}")
        try:
            config = cls.model_validate(raw)
        except ValidationError as exc:
            line = f"invalid {cls.what} config {source}: {validation_line(exc, cls.field_path, at='at ')}"
            raise spec_error_of(exc, line) or ConfigError(line) from None
        if base_dir is not None:  # a new config, not the validated one changed
            config = config.model_copy(update={
                "data": config.data if config.data.is_absolute() else base_dir / config.data,
                "out": config.out if config.out is None or config.out.is_absolute() else base_dir / config.out})
        config.check_whole()
        return config

    @classmethod
    def load(cls, path: Path, overrides: list[str] | None = None) -> Self:
        """Read a config YAML, apply ``key=value`` overrides and validate it."""
        return cls.parse(read_yaml_config(path, overrides, cls.what), str(path))

    @staticmethod
    def field_path(loc: tuple[Any, ...]) -> str:
        """A bad key's path as the user wrote it."""
        return ".".join(str(x) for x in loc)

    def check_whole(self) -> None:
        """What a config checks once every field is valid (its schemes, say): raise ConfigError."""

    def run_dir(self) -> Path:
        """Where the run's folder is, for every pipeline: ``out`` itself, else ``runs/{name}``."""
        return Path(self.out) if self.out is not None else Path("runs") / self.name

    def identity(self, exclude: set[str] | None = None, late: Sequence[str] = (), **replaced: Any) -> str:
        """The digest of the settings (JSON, keys sorted) less ``exclude``, with ``replaced``
        values. The one compatibility rule: a ``late`` key (one added after runs were made) is
        left out while it holds its default, so runs made before the key keep their identity."""
        data = {**self.model_dump(mode="json", exclude=exclude), **replaced}
        for key in late:
            if key in data and data[key] == _json_default(type(self), key):
                del data[key]
        return json_digest(data)


    def select(self, prompts: Sequence[TestPrompt], directions: Sequence[str] | None = None,
               groups: Sequence[str] | None = None) -> list[TestPrompt]:
        """The one prompt selection of every pipeline: ``prompts`` of the config's templates (a
        template the data lacks is an error), of ``directions`` (the config's, or a trained
        direction a pipeline chose for it: then prompts that carry no direction are kept), of
        ``groups``, at most ``limit`` per template; an error when nothing is left."""
        if not prompts:
            raise DatasetError(f"{self.data / 'test_prompts.jsonl'} holds no test prompt (is the dataset built?)")
        if self.templates is not None:
            present = {p.template for p in prompts}
            missing = [t for t in self.templates if t not in present]
            if missing:
                raise DatasetError(f"templates {missing} are not in the dataset (it has {sorted(present)})")
        strict = self.directions is not None
        chosen: list[TestPrompt] = []
        per_template: Counter[str] = Counter()
        for p in prompts:
            if self.templates is not None and p.template not in self.templates:
                continue
            if directions is not None and p.direction not in directions and (strict or p.direction is not None):
                continue
            if groups is not None and p.group not in groups:
                continue
            if self.limit is not None and per_template[p.template] >= self.limit:
                continue
            per_template[p.template] += 1
            chosen.append(p)
        if not chosen:
            raise DatasetError("no test prompt is left after the template/direction/group filters")
        return chosen
