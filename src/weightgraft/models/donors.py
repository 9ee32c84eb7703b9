"""Loading a model set's roles: one :func:`load_role` for every spec, one :class:`LoadedModel` back.

Why one function: a run, ``weightgraft generate``, ``localize`` and ``wg.load`` all load roles;
each used to match the spec string and pick a loader itself. Here the typed spec
(:mod:`weightgraft.models.spec`) picks: a model by name (in full, or lean: only the tensors it
serves, sharing the rest with the base), a LoRA donor on its base role, a low-rank or scaled
donor from its base and donor roles.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from weightgraft.models import loading
from weightgraft.models.lean import donor_view, needed_parameters
from weightgraft.models.loaded import LoadedModel
from weightgraft.models.derived import build_lowrank, build_scaled, lowrank_delta
from weightgraft.models.peft_donor import build_peft
from weightgraft.models.spec import (
    LowRankSpec,
    ModelSpec,
    ModelSpecError,
    PeftSpec,
    QuantizedSpec,
    ScaledSpec,
    is_derived,
    parse_spec,
)

__all__ = ["DTYPES", "LeanSlots", "LoadSettings", "as_loaded", "default_loader", "load_donor", "load_role"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadSettings:
    """How the roles of a run load: where, in which dtype, and with what loader.

    ``loader`` loads a model by its spec's text (tests and ``run_experiment(load=...)`` give
    their own; None: :func:`weightgraft.models.load_model` with the fields below).
    ``cache`` holds what a run's model sets share: the SVD of a (base, donor) pair for every k,
    the base of a LoRA role that no scheme uses."""

    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    device_map: str | dict[str, Any] | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    lean_donors: bool = False
    loader: Callable[[str], Any] | None = None
    cache: dict[Any, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Any, load: Callable[[str, Any], Any] | None = None) -> LoadSettings:
        """The settings of a run config (``device``, ``dtype``, ``device_map``, ``lean_donors``);
        ``load(text, config)``: a custom loader."""
        return cls(device=config.device, dtype=DTYPES[config.dtype], device_map=getattr(config, "device_map", None),
                   lean_donors=bool(getattr(config, "lean_donors", False)),
                   loader=None if load is None or load is default_loader else (lambda text: load(text, config)))


@dataclass(frozen=True)
class LeanSlots:
    """A donor that serves only ``slots`` of ``base``'s model: it holds only their tensors."""

    base: LoadedModel
    slots: set[str]


def as_loaded(obj: Any, spec: ModelSpec) -> LoadedModel:
    """What a custom loader gave, as the one loaded type (its ``source`` and hash, if it has them)."""
    if isinstance(obj, LoadedModel):
        return obj if obj.spec is not None else dataclasses.replace(obj, spec=spec)
    return LoadedModel(model=obj.model, tokenizer=getattr(obj, "tokenizer", None), source=str(getattr(obj, "source", "")),
                       weights_sha256=str(getattr(obj, "weights_sha256", "")), spec=spec,
                       adapter=getattr(obj, "adapter", None))


def _load_named(spec: ModelSpec, settings: LoadSettings) -> LoadedModel:
    if settings.loader is not None:
        return as_loaded(settings.loader(spec.text), spec)
    return loading.load_model(spec, device=settings.device, dtype=settings.dtype, allow_pickle=settings.allow_pickle,
                              trust_remote_code=settings.trust_remote_code, device_map=settings.device_map)


def _lean(spec: ModelSpec, settings: LoadSettings, lean: LeanSlots) -> LoadedModel:
    """A donor holding only what it serves, sharing the rest with the base: read lazily from
    safetensors where the default loader would read a directory, else loaded in full and thinned."""
    needed = needed_parameters(lean.base.model, lean.slots)
    if settings.loader is None:
        built = loading.load_lean_donor(spec, lean.base, needed)
        if built is not None:
            return built
    full = _load_named(spec, settings)
    params = dict(full.model.named_parameters(remove_duplicate=False))
    if needed - set(params):
        return full  # the engine's compatibility check names the mismatch
    thin = copy.copy(full)
    thin.model = donor_view(lean.base.model, {n: params[n] for n in needed}, full.model.config)
    thin.lean = True
    return thin


def load_role(spec: str | ModelSpec, settings: LoadSettings, *, roles: Mapping[str, str | ModelSpec] | None = None,
              loaded: Mapping[str, LoadedModel] | None = None, lean: LeanSlots | None = None) -> LoadedModel:
    """The model a role's spec names. ``roles``: the set's specs (a peft or low-rank role is
    built from them); ``loaded``: roles already loaded (a LoRA donor shares its base's tensors);
    ``lean``: load an ordinary donor holding only the slots it serves (with ``settings.lean_donors``
    and no device_map)."""
    spec = parse_spec(spec)
    specs = {r: parse_spec(s) for r, s in (roles or {}).items()}
    done = loaded or {}
    missing = [r for r in spec.refs() if r not in specs and r not in done] if is_derived(spec) else []  # type: ignore[union-attr]
    if missing:
        raise ModelSpecError(f"{spec.text!r} is built from role {missing[0]!r}, which is not given: name it in the "
                             "same model set (a config's models, --model ROLE=SPEC)")
    if isinstance(spec, PeftSpec):
        base = done.get(spec.base)
        if base is None:
            key = ("peft-base", specs[spec.base].text)
            if key not in settings.cache:
                settings.cache[key] = _load_named(specs[spec.base], settings)
            base = settings.cache[key]
        return build_peft(spec, base)
    if isinstance(spec, LowRankSpec):
        key = ("lowrank", specs[spec.base].text, specs[spec.donor].text)
        if key not in settings.cache:
            base = done.get(spec.base) or _load_named(specs[spec.base], settings)
            donor = _load_named(specs[spec.donor], settings)
            settings.cache[key] = (lowrank_delta(base, donor), base, donor)
        delta, base, donor = settings.cache[key]
        return build_lowrank(spec, base, donor, delta)
    if isinstance(spec, ScaledSpec):
        return build_scaled(spec, _whole(spec.base, specs, done, settings), _whole(spec.donor, specs, done, settings))
    if lean is not None and settings.lean_donors and settings.device_map is None and not isinstance(spec, QuantizedSpec):
        return _lean(spec, settings, lean)  # a quantized donor loads whole: its packed tensors cannot be thinned
    return _load_named(spec, settings)


def _whole(role: str, specs: Mapping[str, ModelSpec], done: Mapping[str, LoadedModel], settings: LoadSettings) -> LoadedModel:
    """Role ``role`` with all its tensors: as loaded if it was loaded whole, else loaded once per run."""
    here = done.get(role)
    if here is not None and not here.lean:
        return here
    key = ("whole", specs[role].text)
    if key not in settings.cache:
        settings.cache[key] = load_role(specs[role], settings, roles=specs, loaded={r: m for r, m in done.items() if not m.lean})
    loaded: LoadedModel = settings.cache[key]
    return loaded


def load_donor(load: Callable[[str, Any], Any], spec: str, config: Any, base: Any, slots_served: set[str]) -> LoadedModel:
    """``load_role`` of an ordinary donor with a run config's settings (kept for callers of the
    older signature)."""
    return load_role(spec, LoadSettings.of(config, load), lean=LeanSlots(as_loaded(base, parse_spec(spec)), slots_served))


def default_loader(spec: str, config: Any) -> LoadedModel:
    """:func:`weightgraft.models.load_model` with a run config's device, dtype and device_map."""
    return load_role(spec, LoadSettings.of(config))
