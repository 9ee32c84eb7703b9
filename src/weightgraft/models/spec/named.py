"""Specs of one model by name: a folder, a hub id, an embedded model, a ``random:`` config, a demo name.

Each kind knows where its files are: how to check that they exist, load them, read their
config for a plan, and where a lean donor reads its tensors."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from weightgraft.models.embedded import EMBEDDED_MODELS
from weightgraft.models.errors import PICKLE_SUFFIXES, RandomSpecError
from weightgraft.models.spec.base import ModelSpec, fill_text

if TYPE_CHECKING:
    from weightgraft.models.footprint import ModelFootprint
    from weightgraft.models.loaded import LoadedModel, LoadSettings

RANDOM_PREFIX = "random:"
# spec -> role of the demo's model set (plain names: no pattern)
DEMO_SPECS: dict[str, Literal["sft", "pre"]] = {"demo": "sft", "demo:sft": "sft", "demo:pre": "pre"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_like_path(text: str) -> bool:
    """A spec that cannot be a hub id ("name" or "org/name") is meant as a path."""
    return (text.startswith(("/", ".", "~")) or text.endswith((".gguf", ".safetensors", *PICKLE_SUFFIXES))
            or "\\" in text or not _HUB_ID.match(text))


class _Located(ModelSpec):
    """A spec read from a path or the hub cache (its text is where)."""

    hub: ClassVar[bool] = False  # whether the text may be a hub id

    @property
    def location(self) -> str:
        """The path or hub id it reads."""
        raise NotImplementedError

    def check(self, role: str = "model") -> None:
        from weightgraft.models.loading import check_location

        check_location(self.location, role, self.hub)

    def load(self, settings: LoadSettings, quantization: object = None) -> LoadedModel:
        from weightgraft.models.loading import finished, read_location

        return finished(read_location(self.location, settings, self.hub, quantization), settings, self, quantization)

    def footprint(self) -> ModelFootprint:
        from weightgraft.models.footprint import location_footprint

        return location_footprint(self.location)

    def safetensors_dir(self) -> Path | None:
        from weightgraft.models.loading import safetensors_folder

        return safetensors_folder(self.location)


@dataclass(frozen=True)
class FolderSpec(_Located):
    """A local path: a model directory (``config.json`` + weights) or a ``.gguf`` file."""

    path: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "folder"

    def __post_init__(self) -> None:
        fill_text(self, self.path)

    @property
    def location(self) -> str:
        return self.path.strip()

    @property
    def folder(self) -> Path | None:
        return Path(self.path).expanduser()


@dataclass(frozen=True)
class HubSpec(_Located):
    """A hub id (``org/name``), loaded only from the local Hugging Face cache (or a folder of
    that name, should one exist by the time it loads)."""

    repo: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "hub"
    hub: ClassVar[bool] = True

    def __post_init__(self) -> None:
        fill_text(self, self.repo)

    @property
    def location(self) -> str:
        return self.repo.strip()


@dataclass(frozen=True)
class EmbeddedSpec(ModelSpec):
    """An embedded model by its (lower-case) name: :data:`weightgraft.models.EMBEDDED_MODELS`."""

    name: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "embedded"

    def __post_init__(self) -> None:
        fill_text(self, self.name)

    def load(self, settings: LoadSettings, quantization: object = None) -> LoadedModel:
        from weightgraft.models.loading import finished, read_embedded

        return finished(read_embedded(self.name, settings, quantization), settings, self, quantization)

    def footprint(self) -> ModelFootprint:
        from weightgraft.models.footprint import embedded_footprint

        return embedded_footprint(self.name, self.text.strip())

    def safetensors_dir(self) -> Path | None:
        from weightgraft.models.embedded import ensure_converted

        return ensure_converted(self.name)

    def source_of(self, directory: Path) -> str:
        from weightgraft.models.loading import embedded_source

        return embedded_source(self.name, directory)

    def loaded_note(self, loaded: LoadedModel) -> str | None:
        from weightgraft.models.embedded import EMBEDDED_MODELS

        embedded = EMBEDDED_MODELS[self.name]
        dtype = next(loaded.model.parameters()).dtype
        return f"{embedded.name}: {embedded.description}, dequantized to {str(dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class RandomSpec(ModelSpec):
    """``random:TARGET[@SEED]``: TARGET is a shipped config's name or a ``config.json`` path
    (resolved by :func:`weightgraft.models.random_models.parse_random_spec`)."""

    target: str
    seed: int = 0
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "random"
    has_tokenizer: ClassVar[bool] = False

    def __post_init__(self) -> None:
        fill_text(self, f"{RANDOM_PREFIX}{self.target}" + (f"@{self.seed}" if self.seed else ""))

    def load(self, settings: LoadSettings, quantization: object = None) -> LoadedModel:
        from weightgraft.models.random_models import load_random

        return load_random(self, device=settings.device, dtype=settings.dtype, device_map=settings.device_map,
                           quantization=quantization, typed=self)

    def footprint(self) -> ModelFootprint:
        from weightgraft.models.footprint import random_footprint

        return random_footprint(self)


@dataclass(frozen=True)
class DemoSpec(ModelSpec):
    """``demo`` / ``demo:sft`` (the demo's finetune) or ``demo:pre`` (its base model)."""

    role: Literal["sft", "pre"] = "sft"
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "demo"

    def __post_init__(self) -> None:
        fill_text(self, f"demo:{self.role}")

    def resolved(self) -> ModelSpec:
        from weightgraft.models.demo_models import demo_target

        return read_named(demo_target(self.role, self.text))

    def check(self, role: str = "model") -> None:
        self.resolved().check(role)

    def load(self, settings: LoadSettings, quantization: object = None) -> LoadedModel:
        return self.resolved().load(settings, quantization)  # type: ignore[call-arg]

    def footprint(self) -> ModelFootprint:
        return self.resolved().footprint()

    def safetensors_dir(self) -> Path | None:
        return self.resolved().safetensors_dir()

    def source_of(self, directory: Path) -> str:
        return self.resolved().source_of(directory)

    def loaded_note(self, loaded: LoadedModel) -> str | None:
        return (f"{self.text.strip()}: {self.resolved().text} (`weightgraft demo`'s "
                f"{'base model' if self.role == 'pre' else 'finetune'})")


NAMED_TYPES: tuple[type, ...] = (FolderSpec, HubSpec, EmbeddedSpec, RandomSpec, DemoSpec)


def read_named(text: str | os.PathLike[str]) -> ModelSpec:
    """The spec of a model named by ``text`` (not a spec built from roles, not ``quantized(...)``):
    a demo name, ``random:``, an embedded name, a path, else a hub id."""
    from weightgraft.models.random_models import split_random

    raw = os.fspath(text)
    stripped, key = raw.strip(), raw.strip().lower()
    if key in DEMO_SPECS:
        return DemoSpec(DEMO_SPECS[key], text=raw)
    if key.startswith(RANDOM_PREFIX):
        try:
            target, seed = split_random(raw)
        except ValueError as exc:
            raise RandomSpecError(str(exc)) from None
        return RandomSpec(target, seed, text=raw)
    if key in EMBEDDED_MODELS:
        return EmbeddedSpec(key, text=raw)
    if isinstance(text, os.PathLike) or Path(stripped).expanduser().exists() or looks_like_path(stripped):
        return FolderSpec(stripped, text=raw)
    return HubSpec(stripped, text=raw)


def resolve_demo_spec(text: str) -> str:
    """The spec text a demo name stands for (the demo's finetune folder or base); any other text unchanged."""
    return read_named(text).resolved().text if text.strip().lower() in DEMO_SPECS else text
