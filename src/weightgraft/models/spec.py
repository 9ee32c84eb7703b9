"""Model specs, typed: what a config, ``-m ROLE=SPEC``, ``wg.load`` or ``check`` names as a model.

Why one module: a spec string is read once, here, where input enters; everything after it
(loading, planning, manifests) asks the typed spec what it is instead of matching the string
again. Every variant keeps ``.text``, the string as the user wrote it: manifests, run
identities and plans record that string, so stored runs keep their identity.

The variants, in the order a string is resolved:

- :class:`DemoSpec` ``demo`` / ``demo:sft`` / ``demo:pre``: the models ``weightgraft demo`` made;
- :class:`RandomSpec` ``random:NAME[@SEED]`` / ``random:PATH/config.json[@SEED]``;
- :class:`PeftSpec` ``peft(BASE_ROLE, ADAPTER_DIR)``: a LoRA donor on another role;
- :class:`LowRankSpec` ``lowrank(ROLE, k=K[, base=ROLE][, vectors=donor|pre])``;
- :class:`ScaledSpec` ``scaled(ROLE, S[, base=ROLE])``: weights ``base + S * (donor - base)``;
- :class:`QuantizedSpec` ``quantized(SPEC, SCHEME)``: a model by name loaded quantized
  (SCHEME: nf4, fp4, int8, torchao-int8; :mod:`weightgraft.models.quantization`);
- :class:`EmbeddedSpec` an embedded model's name (``smollm2-135m``);
- :class:`FolderSpec` a path (a model directory or ``.gguf`` file; existing, or not a hub id);
- :class:`HubSpec` ``org/name`` shaped: a hub id, read only from the local cache.

Whether a folder or hub model exists is checked before loading
(:func:`weightgraft.models.loading.check_model_spec`), not here: parsing reads the text only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeGuard, Union

from pydantic import AfterValidator

from weightgraft.errors import WeightgraftError
from weightgraft.models.embedded import EMBEDDED_MODELS
from weightgraft.models.errors import ModelNotFoundError
from weightgraft.models.quantization.schemes import QUANTIZATIONS as QUANTIZATION_NAMES
from weightgraft.models.quantization.schemes import QuantizationError, check_scheme

__all__ = [
    "DEMO_SPECS", "DemoSpec", "QuantizedSpec", "QuantizedSpecError", "EmbeddedSpec", "FolderSpec", "HubSpec", "LowRankError", "LowRankSpec",
    "ModelSpec", "ModelSpecError", "PeftError", "PeftSpec", "RandomSpec", "ScaledSpec", "is_derived", "looks_like_path",
    "SpecText", "embedded_name", "spec_error_of", "parse_lowrank", "parse_peft", "parse_roles", "parse_spec",
]

Vectors = Literal["donor", "pre"]
# spec -> role of the demo's model set (plain names: no pattern)
DEMO_SPECS: dict[str, Literal["sft", "pre"]] = {"demo": "sft", "demo:sft": "sft", "demo:pre": "pre"}
RANDOM_PREFIX = "random:"
CONFIG_DIR = Path(__file__).with_name("configs")  # the shipped configs of random:NAME
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_PEFT = re.compile(r"^\s*peft\s*\((?P<args>.*)\)\s*$", re.S)
_PEFT_START = re.compile(r"\s*peft\s*\(")  # "peft_models/x" is a directory, "peft(..." a spec
_LOWRANK = re.compile(r"^\s*lowrank\s*\((?P<args>.*)\)\s*$")
_SCALED = re.compile(r"^\s*scaled\s*\((?P<args>.*)\)\s*$")
_QUANTIZED = re.compile(r"^\s*quantized\s*\((?P<args>.*)\)\s*$", re.S)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PEFT_HINT = "write peft(BASE_ROLE, ADAPTER_DIR), e.g. peft(pre, models/lora)"


class ModelSpecError(WeightgraftError, ValueError):
    """A model spec that cannot be read (one line, naming the spec and how to write it)."""


class PeftError(WeightgraftError, ValueError):
    """A peft role spec or adapter directory that cannot make a LoRA donor."""


class LowRankError(WeightgraftError, ValueError):
    """A low-rank spec or model pair that cannot make a low-rank donor."""


class PeftSpecError(ModelSpecError, PeftError):
    """A malformed ``peft(...)`` spec."""


class LowRankSpecError(ModelSpecError, LowRankError):
    """A malformed ``lowrank(...)`` spec."""



class QuantizedSpecError(ModelSpecError, QuantizationError):
    """A malformed ``quantized(...)`` spec, or one naming an unknown or refused scheme."""


class RandomSpecError(ModelSpecError, ModelNotFoundError):
    """A ``random:`` spec that names no config."""


def shipped_configs() -> list[str]:
    """Names ``random:NAME`` accepts: the configs shipped with weightgraft (``models/configs``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def _text(obj: Any, canonical: str) -> None:
    """Fill ``.text`` of a spec built in code (not parsed): its canonical spelling."""
    if not obj.text:
        object.__setattr__(obj, "text", canonical)


@dataclass(frozen=True)
class FolderSpec:
    """A local path: a model directory (``config.json`` + weights) or a ``.gguf`` file."""

    path: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "folder"

    def __post_init__(self) -> None:
        _text(self, self.path)


@dataclass(frozen=True)
class HubSpec:
    """A hub id (``org/name``), loaded only from the local Hugging Face cache (or a folder of
    that name, should one exist by the time it loads)."""

    repo: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "hub"

    def __post_init__(self) -> None:
        _text(self, self.repo)


@dataclass(frozen=True)
class EmbeddedSpec:
    """An embedded model by its (lower-case) name: :data:`weightgraft.models.EMBEDDED_MODELS`."""

    name: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "embedded"

    def __post_init__(self) -> None:
        _text(self, self.name)


@dataclass(frozen=True)
class RandomSpec:
    """``random:TARGET[@SEED]``: TARGET is a shipped config's name or a ``config.json`` path
    (resolved by :func:`weightgraft.models.random_models.parse_random_spec`)."""

    target: str
    seed: int = 0
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "random"

    def __post_init__(self) -> None:
        _text(self, f"{RANDOM_PREFIX}{self.target}" + (f"@{self.seed}" if self.seed else ""))


@dataclass(frozen=True)
class DemoSpec:
    """``demo`` / ``demo:sft`` (the demo's finetune) or ``demo:pre`` (its base model)."""

    role: Literal["sft", "pre"] = "sft"
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "demo"

    def __post_init__(self) -> None:
        _text(self, f"demo:{self.role}")


@dataclass(frozen=True)
class PeftSpec:
    """``peft(BASE_ROLE, DIR)``: the LoRA adapter in DIR on the model set's role BASE_ROLE."""

    base: str
    directory: str
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "peft"

    def __post_init__(self) -> None:
        _text(self, f"peft({self.base}, {self.directory})")

    def refs(self) -> tuple[str, ...]:
        """The roles this role is built from."""
        return (self.base,)


@dataclass(frozen=True)
class LowRankSpec:
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
        _text(self, f"lowrank({self.donor}, k={self.k}{extra})")

    def refs(self) -> tuple[str, ...]:
        """The roles this role is built from (the base first, as it loads)."""
        return (self.base, self.donor)


def scale_text(scale: float) -> str:
    """``scale`` as written in a spec: the shortest text that reads back as the same float."""
    return short if float(short := f"{scale:g}") == scale else repr(float(scale))


@dataclass(frozen=True)
class ScaledSpec:
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
        _text(self, f"scaled({self.donor}, {scale_text(self.scale)}{f', base={self.base}' if self.base != 'pre' else ''})")

    def refs(self) -> tuple[str, ...]:
        """The roles this role is built from (the base first, as it loads)."""
        return (self.base, self.donor)


NamedSpec = Union[FolderSpec, HubSpec, EmbeddedSpec, RandomSpec, DemoSpec]
NAMED_TYPES: tuple[type, ...] = (FolderSpec, HubSpec, EmbeddedSpec, RandomSpec, DemoSpec)


@dataclass(frozen=True)
class QuantizedSpec:
    """``quantized(SPEC, SCHEME)``: the model SPEC names (a folder, hub id, embedded or demo name,
    or ``random:``), loaded with its linear weights quantized by SCHEME (``nf4``, ``fp4``,
    ``int8``, ``torchao-int8``). ``custom``: a transformers quantization config given in Python
    (``wg.load(spec, quantization=BitsAndBytesConfig(...))``); its scheme reads ``custom-<hash>``."""

    inner: NamedSpec
    scheme: str
    custom: Any = field(default=None, compare=False)
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "quantized"

    def __post_init__(self) -> None:
        _text(self, f"quantized({self.inner.text}, {self.scheme})")


ModelSpec = Union[FolderSpec, HubSpec, EmbeddedSpec, RandomSpec, DemoSpec, PeftSpec, LowRankSpec, ScaledSpec, QuantizedSpec]
SPEC_TYPES: tuple[type, ...] = (*NAMED_TYPES, PeftSpec, LowRankSpec, ScaledSpec, QuantizedSpec)


def is_derived(spec: ModelSpec) -> TypeGuard[Union[PeftSpec, LowRankSpec, ScaledSpec]]:
    """Whether the role is built from other roles of its set (peft, lowrank, scaled), not loaded by name."""
    return isinstance(spec, (PeftSpec, LowRankSpec, ScaledSpec))


def looks_like_path(text: str) -> bool:
    """A spec that cannot be a hub id ("name" or "org/name") is meant as a path."""
    return (text.startswith(("/", ".", "~")) or text.endswith((".gguf", ".safetensors", *PICKLE_SUFFIXES))
            or "\\" in text or not _HUB_ID.match(text))


def _peft(text: str) -> PeftSpec | None:
    m = _PEFT.match(text)
    if m is None:
        if _PEFT_START.match(text):
            raise PeftSpecError(f"model spec {text!r}: {_PEFT_HINT}")
        return None
    base, comma, directory = (x.strip() for x in m.group("args").partition(","))
    directory = directory.strip("'\"").strip()
    if not comma or not base or not directory or "=" in base:
        raise PeftSpecError(f"model spec {text!r}: {_PEFT_HINT}")
    return PeftSpec(base, directory, text=text)


def _lowrank(text: str) -> LowRankSpec | None:
    m = _LOWRANK.match(text)
    if m is None:
        if text.strip().startswith("lowrank"):
            raise LowRankSpecError(f"model spec {text!r}: write lowrank(ROLE, k=K), e.g. lowrank(sft, k=8)")
        return None
    parts = [p.strip() for p in m.group("args").split(",") if p.strip()]
    if not parts or "=" in parts[0]:
        raise LowRankSpecError(f"model spec {text!r}: the first argument is the donor role, e.g. lowrank(sft, k=8)")
    fields: dict[str, Any] = {"donor": parts[0]}
    for part in parts[1:]:
        key, _, value = (x.strip() for x in part.partition("="))
        if key == "k" and value.isdigit() and int(value) >= 1:
            fields["k"] = int(value)
        elif key == "base" and value:
            fields["base"] = value
        elif key == "vectors" and value in ("donor", "pre"):
            fields["vectors"] = value
        else:
            raise LowRankSpecError(f"model spec {text!r}: cannot read {part!r} (k=N with N >= 1, base=ROLE, vectors=donor|pre)")
    if "k" not in fields:
        raise LowRankSpecError(f"model spec {text!r}: give the rank, e.g. lowrank({parts[0]}, k=8)")
    return LowRankSpec(**fields, text=text)


def _scaled(text: str) -> ScaledSpec | None:
    m, hint = _SCALED.match(text), "write scaled(ROLE, S[, base=ROLE]), e.g. scaled(sft, 2)"
    if m is None:
        if re.match(r"\s*scaled\s*\(", text):
            raise ModelSpecError(f"model spec {text!r}: {hint}")
        return None
    parts = [p.strip() for p in m.group("args").split(",")]
    key, _, base = (x.strip() for x in (parts[2] if len(parts) == 3 else "base=pre").partition("="))
    if len(parts) not in (2, 3) or not parts[0] or "=" in parts[0] or key != "base" or not base:
        raise ModelSpecError(f"model spec {text!r}: {hint}")
    try:
        scale = float(parts[1])
    except ValueError:
        raise ModelSpecError(f"model spec {text!r}: the scale {parts[1]!r} is not a number ({hint})") from None
    if base == parts[0]:
        raise ModelSpecError(f"model spec {text!r}: the donor and the base are the same role")
    return ScaledSpec(parts[0], scale, base, text=text)


def _quantized(text: str) -> QuantizedSpec | None:
    m = _QUANTIZED.match(text)
    hint = "write quantized(SPEC, SCHEME), e.g. quantized(smollm2-135m, nf4)"
    if m is None:
        if re.match(r"\s*quantized\s*\(", text):
            raise QuantizedSpecError(f"model spec {text!r}: {hint}")
        return None
    inner_text, comma, scheme = (x.strip() for x in m.group("args").rpartition(","))
    scheme = scheme.strip("'\"").strip().lower()
    if not comma or not inner_text or not scheme:
        raise QuantizedSpecError(f"model spec {text!r}: {hint}")
    try:
        return dataclasses.replace(quantized(inner_text, scheme), text=text)
    except QuantizedSpecError as exc:
        raise QuantizedSpecError(f"model spec {text!r}: {exc}") from None


def quantized(spec: str | ModelSpec, scheme: str | Any) -> QuantizedSpec:
    """``spec`` loaded quantized: ``scheme`` a name (``nf4`` ...) or a transformers quantization
    config object (a ``BitsAndBytesConfig`` of your own)."""
    inner = parse_spec(spec)
    if isinstance(inner, QuantizedSpec):
        raise QuantizedSpecError(f"{inner.text!r} is quantized already")
    if not isinstance(inner, NAMED_TYPES):
        raise QuantizedSpecError(f"quantize a model by name (a folder, hub id, embedded name or random:), not a "
                                 f"{inner.kind} role; for QLoRA write peft(ROLE, DIR) over a quantized role")
    if isinstance(scheme, str):
        try:
            check_scheme(scheme.strip().lower())
        except QuantizationError as exc:
            raise QuantizedSpecError(str(exc)) from None
        return QuantizedSpec(inner, scheme.strip().lower())  # type: ignore[arg-type]
    to_dict = getattr(scheme, "to_dict", None)
    if to_dict is None:
        raise QuantizedSpecError(f"quantization is a scheme name ({', '.join(QUANTIZATION_NAMES)}) or a transformers "
                                 f"quantization config, got {type(scheme).__name__}")
    digest = hashlib.sha256(json.dumps(to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:12]
    return QuantizedSpec(inner, f"custom-{digest}", custom=scheme)  # type: ignore[arg-type]


def _random(text: str) -> RandomSpec:
    body, seed = text.strip()[len(RANDOM_PREFIX):], 0
    head, sep, tail = body.rpartition("@")
    if sep and tail.strip().isdigit():
        body, seed = head, int(tail)
    if not body.strip():
        raise RandomSpecError(f"{text.strip()!r}: say which config, e.g. random:llama-3.2-1b "
                              f"(shipped: {', '.join(shipped_configs())}) or random:PATH/config.json")
    return RandomSpec(body.strip(), seed, text=text)


def parse_spec(text: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """The typed spec of ``text`` (a spec already typed is returned as is); a malformed spec is
    one :class:`ModelSpecError` line. Nothing is loaded or looked up but the text itself."""
    if isinstance(text, SPEC_TYPES):
        return text  # type: ignore[return-value]
    if not isinstance(text, (str, os.PathLike)):
        raise ModelSpecError(f"a model spec is a string (a path, an embedded name, a hub id, random:NAME, "
                             f"peft(...), lowrank(...)), got {type(text).__name__}")
    raw = os.fspath(text)
    stripped = raw.strip()
    if not stripped:
        raise ModelSpecError("an empty model spec: give a path, an embedded name, a hub id, random:NAME, "
                             "peft(BASE, DIR) or lowrank(ROLE, k=K)")
    key = stripped.lower()
    if key in DEMO_SPECS:
        return DemoSpec(DEMO_SPECS[key], text=raw)
    if key.startswith(RANDOM_PREFIX):
        return _random(raw)
    derived = _peft(raw) or _lowrank(raw) or _scaled(raw) or _quantized(raw)
    if derived is not None:
        return derived
    if key in EMBEDDED_MODELS:
        return EmbeddedSpec(key, text=raw)
    if isinstance(text, os.PathLike) or Path(stripped).expanduser().exists() or looks_like_path(stripped):
        return FolderSpec(stripped, text=raw)
    return HubSpec(stripped, text=raw)


def parse_roles(roles: dict[str, Any], where: str) -> dict[str, ModelSpec]:
    """Every role's spec of a model set, parsed; an error names ``where`` and the role."""
    out: dict[str, ModelSpec] = {}
    for role, text in roles.items():
        try:
            out[role] = parse_spec(text)
        except ModelSpecError as exc:
            raise type(exc)(f"{where}: role {role!r}: {exc}") from None
    return out


def parse_peft(text: str | ModelSpec) -> PeftSpec | None:
    """The peft spec, None for any other model spec; a malformed one is an error."""
    return spec if isinstance(spec := parse_spec(text), PeftSpec) else None


def parse_lowrank(text: str | ModelSpec) -> LowRankSpec | None:
    """The low-rank spec, None for an ordinary model spec; a malformed one is an error."""
    return spec if isinstance(spec := parse_spec(text), LowRankSpec) else None


def _valid_text(text: str) -> str:
    """A config field's spec, checked where the config is validated (the text is kept as
    written: configs, manifests and run identities record the string)."""
    parse_spec(text)
    return text


# a config's model spec: a string that parses (pydantic then names the field: ``models.sft``)
SpecText = Annotated[str, AfterValidator(_valid_text)]


def embedded_name(text: str) -> str | None:
    """The embedded model ``text`` names (a config's ``tokenizer:`` may name one too), else None."""
    key = str(text).strip().lower()
    return key if key in EMBEDDED_MODELS else None


def spec_error_of(exc: Exception, line: str) -> ModelSpecError | None:
    """A config's validation error caused by a malformed spec, as that spec's error class (a
    ``PeftError`` stays one) with ``line``, the config's one-line message; None for any other."""
    for err in getattr(exc, "errors", lambda: [])():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, ModelSpecError):
            return type(cause)(line)
    return None
