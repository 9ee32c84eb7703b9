"""What every kind of model spec answers: its text, the roles it is built from, how it is checked,
loaded, counted and held.

Why a base class: a spec is parsed once where input enters; after that loading, planning,
manifests and the CLI ask the spec what it is and what to do, instead of matching its kind. A
new kind is one subclass that overrides what differs (:mod:`weightgraft.models.spec.named`,
``built``, ``quantized``, ``checkpoint``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from weightgraft.models.errors import ModelLoadError

if TYPE_CHECKING:
    from weightgraft.models.footprint import ModelFootprint
    from weightgraft.models.loaded import LoadedModel, LoadSettings


def fill_text(spec: Any, canonical: str) -> None:
    """Fill ``.text`` of a spec built in code (not parsed): its canonical spelling."""
    if not spec.text:
        object.__setattr__(spec, "text", canonical)


@dataclass(frozen=True)
class Holding:
    """How a role holds its model in a run, as its spec says: the whole model, a lean donor's
    ``slots``, or a LoRA ``adapter`` on its base's tensors; ``how`` in words. What it costs is
    planning's arithmetic (``weightgraft.planning.costs.holding_bytes``)."""

    how: str = "whole"
    slots: frozenset[str] | None = None
    adapter: Path | None = None
    # a lean donor's expert banks served expert by expert: bank slot name -> the experts it holds
    experts: Mapping[str, frozenset[int]] = field(default_factory=dict)


class RoleSource(Protocol):
    """What building a role out of other roles of its set needs (given by
    :func:`weightgraft.models.donors.load_role`): the set's specs and the roles loaded so far."""

    specs: Mapping[str, ModelSpec]
    settings: LoadSettings

    def named(self, spec: ModelSpec) -> LoadedModel:
        """A model by name, lean where the caller asked for a lean donor."""

    def plain(self, role: str) -> LoadedModel:
        """Role ``role`` as loaded in this call, else loaded by name in full."""

    def whole(self, role: str) -> LoadedModel:
        """Role ``role`` with all its tensors (built once per run)."""

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per run for ``key``."""


class ModelSpec:
    """A model spec of any kind; subclasses are frozen dataclasses with a ``text`` field (the
    string as the user wrote it: manifests, run identities and plans record it)."""

    text: str
    kind: ClassVar[str] = ""
    has_tokenizer: ClassVar[bool] = True  # random models have none

    def refs(self) -> tuple[str, ...]:
        """The roles of its model set this role is built from (none: a model by name)."""
        return ()

    @property
    def derived(self) -> bool:
        """Whether the role is built from other roles of its set, not loaded by name."""
        return bool(self.refs())

    @property
    def by_name(self) -> bool:
        """Whether it names one model that ``quantized(...)`` can wrap."""
        return not self.derived

    @property
    def adapter(self) -> tuple[str, str] | None:
        """``(base role, adapter directory)`` of a LoRA donor, else None."""
        return None

    @property
    def scheme(self) -> str | None:
        """The quantization scheme it loads with, else None."""
        return None

    @property
    def training_step(self) -> int | None:
        """The optimizer step of the finetune it is a snapshot of, else None."""
        return None

    @property
    def training_run(self) -> Path | None:
        """The finetune's folder it is a snapshot of, else None."""
        return None

    @property
    def folder(self) -> Path | None:
        """The model folder it names on disk (for manifests written beside the weights), else None."""
        return None

    def shape_role(self) -> str | None:
        """The role whose shapes this role has (a built role's donor or base), None: its own."""
        return None

    def unquantized(self) -> ModelSpec:
        """The same model loaded without quantization (itself where it is not quantized)."""
        return self

    def resolved(self) -> ModelSpec:
        """The spec it stands for (a demo name: the demo's model), itself for any other."""
        return self

    def anchored(self, folder: Path) -> str | None:
        """Its text with a relative path taken from ``folder`` (a config file's), None where it
        names no path of its own to anchor (the caller anchors a plain path)."""
        return None

    def check(self, role: str = "model") -> None:
        """Refuse, in one line and before loading, a spec that names no usable model."""

    def check_in_set(self, role: str, specs: Mapping[str, ModelSpec], where: str) -> None:
        """Refuse, before loading, a role that its model set cannot build."""

    def load(self, settings: LoadSettings) -> LoadedModel:
        """The model, loaded by name."""
        raise ModelLoadError(f"{self.text!r} is built from other roles of a model set: load it with "
                             "weightgraft.models.donors.load_role (a config's roles), or wg.load_peft")

    def build(self, source: RoleSource) -> LoadedModel:
        """The role's model within its set (a model by name: loaded, lean if asked)."""
        return source.named(self)

    def footprint(self) -> ModelFootprint:
        """Its shapes and bytes, from its config alone."""
        raise ModelLoadError(f"{self.text!r} is built from other roles: plan for the roles it names")

    def safetensors_dir(self) -> Path | None:
        """The safetensors model directory a lean donor reads lazily, None where it has none."""
        return None

    def source_of(self, directory: Path) -> str:
        """How a model read from ``directory`` for this spec says where it came from."""
        return f"dir:{directory}"

    def loaded_note(self, loaded: LoadedModel) -> str | None:
        """A line saying what a short name stood for once loaded, None where it says itself."""
        return None

    def holding(self, served: set[str] | None, lean: bool) -> Holding:
        """How the role is held in a run: whole, or a lean donor's ``served`` slots when ``lean``
        (None: the base, held whole)."""
        if not lean or served is None:
            return Holding()
        return Holding("lean", slots=frozenset(served))

