"""Model specs, typed: what a config, ``-m ROLE=SPEC``, ``wg.load`` or ``check`` names as a model.

A spec string is read once (:func:`parse_spec`); after that every part of weightgraft asks the
typed spec what to do: check it before loading, load it, build it from other roles of its set,
count its footprint, say how it is held. Every kind keeps ``.text``, the string as the user
wrote it: manifests, run identities and plans record that string, so stored runs keep their
identity. The kinds: :mod:`.named` (folder, hub id, embedded, ``random:``, ``demo``),
:mod:`.built` (``peft``, ``lowrank``, ``scaled``), :mod:`.quantized`, :mod:`.checkpoint`."""

from weightgraft.models.errors import (
    LowRankError,
    LowRankSpecError,
    ModelSpecError,
    PeftError,
    PeftSpecError,
    RandomSpecError,
)
from weightgraft.models.spec.base import Holding, ModelSpec, RoleSource
from weightgraft.models.spec.built import LowRankSpec, PeftSpec, ScaledSpec, Vectors, scale_text
from weightgraft.models.spec.checkpoint import CheckpointSpec, saved_steps, snapshot_dir
from weightgraft.models.spec.named import (
    DemoSpec,
    EmbeddedSpec,
    FolderSpec,
    HubSpec,
    RandomSpec,
    looks_like_path,
    resolve_demo_spec,
)
from weightgraft.models.spec.parse import (
    SpecText,
    embedded_name,
    parse_lowrank,
    parse_peft,
    parse_scaled,
    parse_spec,
    quantized,
    spec_error_of,
    written_scaled,
)
from weightgraft.models.spec.quantized import QuantizedSpec, QuantizedSpecError
from weightgraft.models.spec.roles import check_models, check_roles, parse_roles, random_roles, refuse_random

__all__ = [
    "CheckpointSpec", "DemoSpec", "EmbeddedSpec", "FolderSpec", "Holding", "HubSpec", "LowRankError", "LowRankSpec",
    "LowRankSpecError", "ModelSpec", "ModelSpecError", "PeftError", "PeftSpec", "PeftSpecError", "QuantizedSpec",
    "QuantizedSpecError", "RandomSpec", "RandomSpecError", "RoleSource", "ScaledSpec", "SpecText", "Vectors",
    "check_models", "check_roles", "embedded_name", "looks_like_path", "parse_lowrank", "parse_peft", "parse_roles",
    "parse_scaled", "parse_spec", "quantized", "random_roles", "refuse_random", "resolve_demo_spec", "saved_steps", "scale_text",
    "snapshot_dir", "spec_error_of", "written_scaled",
]
