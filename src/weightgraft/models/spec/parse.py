"""Reading a spec string: the one place where the text a config, ``-m ROLE=SPEC``, ``wg.load``
or ``check`` names is turned into its typed kind.

The forms, in the order a string is resolved: ``peft(BASE_ROLE, DIR)``, ``lowrank(ROLE, k=K[,
base=ROLE][, vectors=donor|pre])``, ``scaled(ROLE, S[, base=ROLE])``, ``quantized(SPEC, SCHEME)``,
``checkpoint(DIR, step=K)``, then a model by name (``demo``, ``random:``, an embedded name, a
path, a hub id: :func:`weightgraft.models.spec.named.read_named`). Whether a folder or hub
model exists is checked before loading (``spec.check()``), not here: parsing reads the text only."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Annotated, Any

from pydantic import AfterValidator

from weightgraft.models.embedded import EMBEDDED_MODELS
from weightgraft.models.errors import LowRankSpecError, ModelSpecError, PeftSpecError
from weightgraft.models.spec.base import ModelSpec
from weightgraft.models.spec.built import LowRankSpec, PeftSpec, ScaledSpec
from weightgraft.models.spec.checkpoint import read_checkpoint
from weightgraft.models.spec.named import read_named
from weightgraft.models.spec.quantized import QuantizedSpec, QuantizedSpecError, quantized_of

_PEFT = re.compile(r"^\s*peft\s*\((?P<args>.*)\)\s*$", re.S)
_PEFT_START = re.compile(r"\s*peft\s*\(")  # "peft_models/x" is a directory, "peft(..." a spec
_LOWRANK = re.compile(r"^\s*lowrank\s*\((?P<args>.*)\)\s*$")
_SCALED = re.compile(r"^\s*scaled\s*\((?P<args>.*)\)\s*$")
_SCALED_START = re.compile(r"\s*scaled\s*\(")  # written as a scaled role, well formed or not
_QUANTIZED = re.compile(r"^\s*quantized\s*\((?P<args>.*)\)\s*$", re.S)
_PEFT_HINT = "write peft(BASE_ROLE, ADAPTER_DIR), e.g. peft(pre, models/lora)"


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
        if written_scaled(text):
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


def parse_spec(text: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """The typed spec of ``text`` (a spec already typed is returned as is); a malformed spec is
    one :class:`ModelSpecError` line. Nothing is loaded or looked up but the text itself."""
    if isinstance(text, ModelSpec):
        return text
    if not isinstance(text, (str, os.PathLike)):
        raise ModelSpecError(f"a model spec is a string (a path, an embedded name, a hub id, random:NAME, "
                             f"peft(...), lowrank(...)), got {type(text).__name__}")
    raw = os.fspath(text)
    if not raw.strip():
        raise ModelSpecError("an empty model spec: give a path, an embedded name, a hub id, random:NAME, "
                             "peft(BASE, DIR) or lowrank(ROLE, k=K)")
    if isinstance(text, str):
        formed = _peft(raw) or _lowrank(raw) or _scaled(raw) or _quantized(raw) or read_checkpoint(raw)
        if formed is not None:
            return formed
    return read_named(text)


def quantized(spec: str | os.PathLike[str] | ModelSpec, scheme: str | Any) -> QuantizedSpec:
    """``spec`` loaded quantized: ``scheme`` a name (``nf4`` ...) or a transformers quantization
    config object (a ``BitsAndBytesConfig`` of your own)."""
    return quantized_of(parse_spec(spec), scheme)


def parse_peft(text: str | ModelSpec) -> PeftSpec | None:
    """The peft spec, None for any other model spec; a malformed one is an error."""
    return spec if isinstance(spec := parse_spec(text), PeftSpec) else None


def parse_lowrank(text: str | ModelSpec) -> LowRankSpec | None:
    """The low-rank spec, None for an ordinary model spec; a malformed one is an error."""
    return spec if isinstance(spec := parse_spec(text), LowRankSpec) else None


def parse_scaled(text: str | ModelSpec) -> ScaledSpec | None:
    """The scaled spec, None for any other model spec; a malformed one is an error."""
    return spec if isinstance(spec := parse_spec(text), ScaledSpec) else None


def written_scaled(text: str) -> bool:
    """Whether ``text`` is written as a scaled role (``scaled(...)``, well formed or not), so a
    caller reads it as a spec only then (no other text is looked up as a path)."""
    return _SCALED_START.match(text) is not None


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
