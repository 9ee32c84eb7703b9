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
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from weightgraft.models.lean import bank_experts, donor_view, needed_parameters
from weightgraft.models.loaded import DeviceMap, LoadedModel, LoadSettings
from weightgraft.models.spec import ModelSpec, ModelSpecError, parse_spec
from weightgraft.models.tokenization import check_same_tokenizer, give_tokenizer

__all__ = ["DTYPES", "LeanSlots", "LoadSettings", "as_loaded", "default_loader", "load_donor", "load_member", "load_model", "load_role"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LeanSlots:
    """A donor that serves only ``slots`` of ``base``'s model: it holds only their tensors."""

    base: LoadedModel
    slots: set[str]
    # expert bank slot name -> the experts served, where a run grafts some experts of a bank only:
    # the donor holds those experts' slices (bit for bit the whole bank's output on them)
    experts: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)


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
    return spec.load(settings)


def _lean(spec: ModelSpec, settings: LoadSettings, lean: LeanSlots) -> LoadedModel:
    """A donor holding only what it serves, sharing the rest with the base: read lazily from
    safetensors where the default loader would read a directory, else loaded in full and thinned."""
    needed = needed_parameters(lean.base.model, lean.slots)
    held = bank_experts(lean.base.model, lean.experts)
    if settings.loader is None:
        directory = spec.safetensors_dir()
        if directory is not None:
            from weightgraft.models.loading import read_lean

            built = read_lean(directory, lean.base, needed, spec.source_of(directory), spec, held)
            if built is not None:
                return built
    full = _load_named(spec, settings)
    params = dict(full.model.named_parameters(remove_duplicate=False))
    if needed - set(params):
        return full  # the engine's compatibility check names the mismatch
    thin = copy.copy(full)
    thin.model = donor_view(lean.base.model, {n: params[n] for n in needed}, full.model.config, held)
    thin.lean = True
    return thin


@dataclass
class _Roles:
    """The roles of one ``load_role`` call: what a built role is made from (a :class:`RoleSource`)."""

    specs: Mapping[str, ModelSpec]
    settings: LoadSettings
    done: Mapping[str, LoadedModel]
    lean: LeanSlots | None

    def named(self, spec: ModelSpec) -> LoadedModel:
        if self.lean is not None and self.settings.lean_donors and self.settings.device_map is None and spec.scheme is None:
            return _lean(spec, self.settings, self.lean)  # a quantized donor loads whole: its packed tensors cannot be thinned
        return _load_named(spec, self.settings)

    def plain(self, role: str) -> LoadedModel:
        here = self.done.get(role)
        if here is not None:
            return here
        return self.cached(("named", self.specs[role].text), lambda: _load_named(self.specs[role], self.settings))

    def whole(self, role: str) -> LoadedModel:
        here = self.done.get(role)
        if here is not None and not here.lean:
            return here
        whole = {r: m for r, m in self.done.items() if not m.lean}
        return self.cached(("whole", self.specs[role].text),
                           lambda: load_role(self.specs[role], self.settings, roles=self.specs, loaded=whole))

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self.settings.cache:
            self.settings.cache[key] = make()
        return self.settings.cache[key]


def load_role(spec: str | ModelSpec, settings: LoadSettings, *, roles: Mapping[str, str | ModelSpec] | None = None,
              loaded: Mapping[str, LoadedModel] | None = None, lean: LeanSlots | None = None) -> LoadedModel:
    """The model a role's spec names. ``roles``: the set's specs (a peft or low-rank role is
    built from them); ``loaded``: roles already loaded (a LoRA donor shares its base's tensors);
    ``lean``: load an ordinary donor holding only the slots it serves (with ``settings.lean_donors``
    and no device_map)."""
    spec = parse_spec(spec)
    specs = {r: parse_spec(s) for r, s in (roles or {}).items()}
    done = loaded or {}
    missing = [r for r in spec.refs() if r not in specs and r not in done]
    if missing:
        raise ModelSpecError(f"{spec.text!r} is built from role {missing[0]!r}, which is not given: name it in the "
                             "same model set (a config's models, --model ROLE=SPEC)")
    return spec.build(_Roles(specs, settings, done, lean))


def load_model(spec: str | os.PathLike[str] | ModelSpec, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, allow_pickle: bool = False, trust_remote_code: bool = False,
               device_map: DeviceMap | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from an embedded name, a path or a cached hub id.

    Args:
        spec: ``"smollm2-135m"`` / ``"gemma3-270m"`` (embedded; converted on first use), a model
            directory, a ``.gguf`` file, a hub id already in the local Hugging Face cache (nothing
            is downloaded), ``demo`` / ``demo:pre`` (what ``weightgraft demo`` made),
            ``checkpoint(DIR, step=K)`` (a finetune's snapshot), ``quantized(SPEC, SCHEME)``, or
            ``random:NAME[@SEED]`` / ``random:PATH/config.json[@SEED]``: the architecture with
            seeded random weights and no tokenizer (weightgraft.models.random_models).
        device: where to put the model.
        dtype: parameter dtype (GGUF weights are dequantized to it).
        allow_pickle: allow ``.bin``/``.pt`` pickle checkpoints (they can run code on load).
        trust_remote_code: allow a model directory's custom Python code to run.
        device_map: place the layers of a model too large for one GPU over several
            (``"auto"`` or a dict, as in ``from_pretrained``; needs a model directory or an
            embedded name). Donors must be loaded with the same map. Offloading weights to
            CPU or disk is refused: grafting reads the weights directly.

    Raises:
        ModelNotFoundError: nothing by that name/path exists locally.
        PickleRefusedError: only pickle weights and ``allow_pickle`` is False.
        CorruptCheckpointError: missing config/weights/tokenizer or a truncated file.
    """
    return parse_spec(spec).load(LoadSettings(device=device, dtype=dtype, allow_pickle=allow_pickle,
                                              trust_remote_code=trust_remote_code, device_map=device_map))


def load_donor(load: Callable[[str, Any], Any], spec: str, config: Any, base: Any, slots_served: set[str]) -> LoadedModel:
    """``load_role`` of an ordinary donor with a run config's settings (kept for callers of the
    older signature)."""
    return load_role(spec, LoadSettings.of(config, None if load is default_loader else load),
                     lean=LeanSlots(as_loaded(base, parse_spec(spec)), slots_served))


def default_loader(spec: str, settings: LoadSettings) -> LoadedModel:
    """The spec's own loading with the run's settings (device, dtype, device_map): what a
    pipeline loads with when it is given no loader."""
    return load_role(spec, dataclasses.replace(settings, loader=None))


def load_member(spec: str | ModelSpec, role: str, settings: LoadSettings, *, tokenizer: Any = None,
                base: LoadedModel | None = None, roles: Mapping[str, str | ModelSpec] | None = None,
                loaded: Mapping[str, LoadedModel] | None = None, lean: LeanSlots | None = None) -> LoadedModel:
    """One model of a pipeline's model set, the one way every pipeline loads it: the role's model
    (:func:`load_role`), given the config's ``tokenizer`` where it has none, and refused in one
    line where its tokenizer is not ``base``'s (grafting mixes their ids)."""
    model = load_role(spec, settings, roles=roles, loaded=loaded, lean=lean)
    give_tokenizer(model, tokenizer, role)
    if base is not None:
        check_same_tokenizer(base.tokenizer, model.tokenizer, f"model {role!r}")
    return model
