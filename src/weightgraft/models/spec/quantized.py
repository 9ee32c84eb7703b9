"""``quantized(SPEC, SCHEME)``: a model by name, loaded with its linear weights quantized.

SCHEME is nf4, fp4, int8 or torchao-int8 (:mod:`weightgraft.models.quantization`), or a
transformers quantization config given in Python. The spec checks the scheme's package and the
model before loading, plans the quantized bytes, and loads through the named model's own kind."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from weightgraft.models.errors import QuantizedSpecError as QuantizedSpecError
from weightgraft.models.quantization.schemes import QUANTIZATIONS, QuantizationError, check_scheme
from weightgraft.models.spec.base import Holding, ModelSpec, fill_text

if TYPE_CHECKING:
    from weightgraft.models.footprint import ModelFootprint
    from weightgraft.models.loaded import LoadedModel, LoadSettings


@dataclass(frozen=True)
class QuantizedSpec(ModelSpec):
    """``quantized(SPEC, SCHEME)``: the model SPEC names (a folder, hub id, embedded or demo name,
    or ``random:``), loaded with its linear weights quantized by SCHEME (``nf4``, ``fp4``,
    ``int8``, ``torchao-int8``). ``custom``: a transformers quantization config given in Python
    (``wg.load(spec, quantization=BitsAndBytesConfig(...))``); its scheme reads ``custom-<hash>``."""

    inner: ModelSpec
    scheme_name: str
    custom: Any = field(default=None, compare=False)
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "quantized"

    def __post_init__(self) -> None:
        fill_text(self, f"quantized({self.inner.text}, {self.scheme_name})")

    @property
    def scheme(self) -> str | None:
        return self.scheme_name

    @property
    def has_tokenizer(self) -> bool:  # type: ignore[override]
        return self.inner.has_tokenizer

    @property
    def folder(self) -> Path | None:
        return self.inner.folder

    def unquantized(self) -> ModelSpec:
        return self.inner

    def resolved(self) -> ModelSpec:
        inner = self.inner.resolved()
        return self if inner is self.inner else QuantizedSpec(inner, self.scheme_name, self.custom, self.text)

    def check(self, role: str = "model") -> None:
        from weightgraft.models.quantization.schemes import check_installed

        if self.custom is None:
            check_installed(self.scheme_name)
        self.inner.check(role)
        if self.custom is None and self.scheme_name == "torchao-int8":
            try:
                self.footprint()  # refuses an architecture with no module it would convert
            except QuantizationError as exc:
                raise QuantizationError(f"{role} {exc}") from None

    def load(self, settings: LoadSettings, quantization: object = None) -> LoadedModel:
        """Quantized by transformers as it loads, on its device."""
        import dataclasses

        from weightgraft.models.quantization.load import spec_config

        if self.custom is None and self.scheme_name == "torchao-int8":
            self.footprint()
        config = spec_config(self, settings.dtype)
        placed = settings if settings.device_map is not None else dataclasses.replace(settings, device_map={"": str(settings.device)})
        loaded = self.inner.resolved().load(placed, config)  # type: ignore[call-arg]
        loaded.source += f" quantized {self.scheme_name}"
        loaded.spec = self
        return loaded

    def footprint(self) -> ModelFootprint:
        from weightgraft.models.footprint import quantized_footprint

        return quantized_footprint(self.text.strip(), self.inner.footprint(), self)

    def holding(self, served: set[str] | None, lean: bool) -> Holding:
        return Holding()  # a quantized donor loads whole: its packed tensors cannot be thinned


def quantized_of(inner: ModelSpec, scheme: str | Any) -> QuantizedSpec:
    """``inner`` loaded quantized: ``scheme`` a name (``nf4`` ...) or a transformers quantization
    config object (a ``BitsAndBytesConfig`` of your own)."""
    if inner.scheme is not None:
        raise QuantizedSpecError(f"{inner.text!r} is quantized already")
    if not inner.by_name:
        raise QuantizedSpecError(f"quantize a model by name (a folder, hub id, embedded name or random:), not a "
                                 f"{inner.kind} role; for QLoRA write peft(ROLE, DIR) over a quantized role")
    if isinstance(scheme, str):
        try:
            check_scheme(scheme.strip().lower())
        except QuantizationError as exc:
            raise QuantizedSpecError(str(exc)) from None
        return QuantizedSpec(inner, scheme.strip().lower())
    to_dict = getattr(scheme, "to_dict", None)
    if to_dict is None:
        raise QuantizedSpecError(f"quantization is a scheme name ({', '.join(QUANTIZATIONS)}) or a transformers "
                                 f"quantization config, got {type(scheme).__name__}")
    digest = hashlib.sha256(json.dumps(to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:12]
    return QuantizedSpec(inner, f"custom-{digest}", custom=scheme)
