"""Specs of roles built from other roles of their model set: a LoRA donor on a base role
(``peft``), a low-rank approximation of a finetune (``lowrank``), a finetune's change scaled
(``scaled``).

Each kind names the roles it is built from, refuses a set that cannot build it (before any
model loads), builds itself from the loaded roles, and says whose shapes it has for a plan."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from weightgraft.models.errors import LowRankError, ModelSpecError, PeftError
from weightgraft.models.spec.base import Holding, ModelSpec, RoleSource, fill_text

if TYPE_CHECKING:
    from weightgraft.models.loaded import LoadedModel

Vectors = Literal["donor", "pre"]


def _refs_defined(spec: ModelSpec, role: str, specs: Mapping[str, ModelSpec], where: str, error: type[Exception]) -> None:
    for ref in spec.refs():
        if ref not in specs:
            raise error(f"{where}: role {role!r} = {spec.text!r} refers to role {ref!r}, which the set does not define"
                        + (f" (it has {sorted(specs)})" if error is PeftError else ""))


@dataclass(frozen=True)
class PeftSpec(ModelSpec):
    """``peft(BASE_ROLE, DIR)``: the LoRA adapter in DIR on the model set's role BASE_ROLE."""

    base: str
    directory: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "peft"

    def __post_init__(self) -> None:
        fill_text(self, f"peft({self.base}, {self.directory})")

    def refs(self) -> tuple[str, ...]:
        return (self.base,)

    @property
    def adapter(self) -> tuple[str, str] | None:
        return self.base, self.directory

    def shape_role(self) -> str | None:
        return self.base

    def anchored(self, folder: Path) -> str | None:
        if Path(self.directory).expanduser().is_absolute() or not (Path(folder) / self.directory).exists():
            return self.text
        return f"peft({self.base}, {Path(folder) / self.directory})"

    def check_in_set(self, role: str, specs: Mapping[str, ModelSpec], where: str) -> None:
        from weightgraft.models.peft_donor import check_adapter_dir

        _refs_defined(self, role, specs, where, PeftError)
        ref = specs[self.base]
        if ref.derived:
            raise PeftError(f"{where}: role {role!r} refers to {self.base!r}, itself a derived role ({ref.text!r}); "
                            "the base of an adapter is an ordinary model")
        try:
            check_adapter_dir(self.directory)
        except PeftError as exc:
            raise PeftError(f"{where}: role {role!r}: {exc}") from None

    def build(self, source: RoleSource) -> LoadedModel:
        from weightgraft.models.peft_donor import build_peft

        return build_peft(self, source.plain(self.base))

    def holding(self, served: set[str] | None, lean: bool) -> Holding:
        return Holding("LoRA adapter (the base's tensors shared)", adapter=Path(self.directory))


@dataclass(frozen=True)
class LowRankSpec(ModelSpec):
    """``lowrank(ROLE, k=K[, base=ROLE][, vectors=donor|pre])`` from a config's model roles."""

    donor: str
    k: int
    base: str = "pre"
    vectors: Vectors = "donor"
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "lowrank"

    def __post_init__(self) -> None:
        extra = (f", base={self.base}" if self.base != "pre" else "") + (
            f", vectors={self.vectors}" if self.vectors != "donor" else "")
        fill_text(self, f"lowrank({self.donor}, k={self.k}{extra})")

    def refs(self) -> tuple[str, ...]:
        """The roles this role is built from (the base first, as it loads)."""
        return (self.base, self.donor)

    def shape_role(self) -> str | None:
        return self.donor

    def check_in_set(self, role: str, specs: Mapping[str, ModelSpec], where: str) -> None:
        _refs_defined(self, role, specs, where, LowRankError)
        for ref in (self.donor, self.base):
            if specs[ref].adapter is not None:
                raise PeftError(f"{where}: role {role!r} = {self.text!r} builds on {ref!r}, a peft role; "
                                "low-rank donors take ordinary models")
            if specs[ref].derived:
                raise LowRankError(f"{where}: role {role!r} refers to {ref!r}, itself a derived role ({specs[ref].text!r}); "
                                   "low-rank donors take ordinary models")

    def build(self, source: RoleSource) -> LoadedModel:
        from weightgraft.models.derived import build_lowrank, lowrank_delta

        base, donor = source.plain(self.base), source.plain(self.donor)
        delta = source.cached(("lowrank", source.specs[self.base].text, source.specs[self.donor].text),
                              lambda: lowrank_delta(base, donor))
        return build_lowrank(self, base, donor, delta)

    def holding(self, served: set[str] | None, lean: bool) -> Holding:
        return Holding("low-rank (whole model; SVD factors not counted)")


def scale_text(scale: float) -> str:
    """``scale`` as written in a spec: the shortest text that reads back as the same float."""
    return short if float(short := f"{scale:g}") == scale else repr(float(scale))


@dataclass(frozen=True)
class ScaledSpec(ModelSpec):
    """``scaled(ROLE, S[, base=ROLE])``: the base role with every weight at ``base + S * (donor -
    base)`` (0: the base, 1: the donor, 2: the change doubled, -1: reversed); a rule's ``scale``."""

    donor: str
    scale: float
    base: str = "pre"
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "scaled"

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale):
            raise ModelSpecError(f"model spec {self.text or self.donor!r}: the scale must be a finite number, got {self.scale}")
        fill_text(self, f"scaled({self.donor}, {scale_text(self.scale)}{f', base={self.base}' if self.base != 'pre' else ''})")

    def refs(self) -> tuple[str, ...]:
        """The roles this role is built from (the base first, as it loads)."""
        return (self.base, self.donor)

    def serving_role(self) -> str | ScaledSpec:
        """The role whose weights serve this spec's cells: the donor at scale 1, the base at 0
        (so those load nothing new), else this spec in its one spelling (``text`` as written
        by ``scaled``, however the spec was typed), the role built from the two."""
        if self.scale in (0, 1):
            return self.donor if self.scale == 1 else self.base
        return ScaledSpec(self.donor, self.scale, self.base)

    def shape_role(self) -> str | None:
        return self.donor

    def check_in_set(self, role: str, specs: Mapping[str, ModelSpec], where: str) -> None:
        _refs_defined(self, role, specs, where, ModelSpecError)

    def build(self, source: RoleSource) -> LoadedModel:
        from weightgraft.models.derived import build_scaled

        return build_scaled(self, source.whole(self.base), source.whole(self.donor))

    def holding(self, served: set[str] | None, lean: bool) -> Holding:
        return Holding()
