"""Lean donors: a donor holds only the tensors that some scheme grafts from it.

The engine calls a donor's module only where the donor serves a slot, so every other tensor
of the donor is dead weight. A *donor view* is a structural copy of the base model that
shares all of the base's tensors and holds its own tensor only where (a) some scheme grafts
that slot from the donor and (b) the donor's tensor differs from the base's. Those tensors
are read one by one from the donor's safetensors files (nothing else is loaded), or taken
from an already loaded donor.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from weightgraft.engine import projections
from weightgraft.engine.architectures import adapter_for, model_slots
from weightgraft.engine.architectures.slots import graftable_state, part_state
from weightgraft.engine.architectures.vision_language import CHECKPOINT_ATTR, OUTSIDE_DIFFERS_ATTR, checkpoint_of
from weightgraft.engine.compat import ModelMismatchError
from weightgraft.models.errors import ModelNotFoundError
from weightgraft.models.hashing import hash_tensor

__all__ = [
    "MemoryReport",
    "bank_experts",
    "donor_view",
    "lean_from_safetensors",
    "memory_report",
    "needed_parameters",
    "slot_parameters",
]


def slot_parameters(model: nn.Module) -> dict[str, list[str]]:
    """Slot name -> the parameter names (as in ``named_parameters``) its modules hold, and their
    persistent buffers (a router's routing-score correction bias): a lean donor holds its own."""
    out: dict[str, list[str]] = {}
    for slot in model_slots(model):
        names: list[str] = []
        for part in slot.parts:  # a part naming some tensors of its module (a mixer's A_log) holds those
            names += [f"{part.path}.{n}" for n, _ in part_state(model, part)]
        out[slot.name] = names
    return out


def needed_parameters(model: nn.Module, slot_names: Iterable[str]) -> set[str]:
    """The parameter names a donor must hold to serve ``slot_names``."""
    table = slot_parameters(model)
    return {p for s in slot_names for p in table[s]}


def _aliases(model: nn.Module) -> dict[str, list[str]]:
    """Parameter name -> every name of the same tensor (tied embeddings have two)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def _set_parameter(model: nn.Module, name: str, param: torch.Tensor) -> None:
    path, _, attr = name.rpartition(".")
    setattr(model.get_submodule(path) if path else model, attr, param)


def _structural_copy(base: nn.Module) -> nn.Module:
    """A copy of ``base``'s module tree that shares every parameter and buffer with it."""
    memo: dict[int, object] = {id(t): t for t in base.parameters()}
    memo.update({id(t): t for t in base.buffers()})
    view = copy.deepcopy(base, memo)
    for module in view.modules():  # deepcopy copies hooks too: a view must not run them
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
    return view


@torch.no_grad()
def donor_view(
    base: nn.Module, tensors: Mapping[str, torch.Tensor], config: object | None = None,
    held: Mapping[str, tuple[int, ...]] | None = None,
) -> nn.Module:
    """A model that is ``base`` except for ``tensors`` (parameter name -> donor tensor).

    A tensor equal to the base's is not held: the base's is shared. Names that are tied in
    the base (one tensor, two names) share one donor tensor when the donor gives them equal
    values, as a tied donor does. ``config`` (the donor's) replaces the base's on the view,
    so that the engine's compatibility check compares the donor's own config. ``held`` (expert
    bank module path -> experts) makes those banks hold only those experts (``moe.hold_experts``);
    their tensors in ``tensors`` are whole or already those experts' slices."""
    params = dict(graftable_state(base))
    view = _structural_copy(base)
    if config is not None:
        # the view runs the base's modules, so its experts implementation is the base's
        cast(Any, config)._experts_implementation = getattr(projections.hf_config(base), "_experts_implementation", None)
        view.config = config
    compact = _hold_experts(view, base, params, tensors, held or {})
    made: dict[int, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name in compact:
            continue
        if name not in params:
            raise KeyError(f"{name!r} is not a parameter or buffer of the base model")
        ref = params[name]
        if tuple(tensor.shape) != tuple(ref.shape):
            raise ModelMismatchError(
                f"tensor {name!r} has shape {list(tensor.shape)} in the donor but "
                f"{list(ref.shape)} in the base: the models do not match"
            )
        tensor = tensor.to(device=ref.device, dtype=ref.dtype)
        if torch.equal(tensor, ref):
            continue
        key = id(tensors[name])
        if key not in made:  # a buffer stays a plain tensor (nn.Module keeps it a buffer)
            made[key] = nn.Parameter(tensor, requires_grad=False) if isinstance(ref, nn.Parameter) else tensor
        _set_parameter(view, name, made[key])
    return view.eval()


def bank_experts(base: nn.Module, experts: Mapping[str, Iterable[int]]) -> dict[str, tuple[int, ...]]:
    """Expert bank slot name -> experts, as bank module path -> experts (ascending), leaving out
    a bank asked for whole (every expert)."""
    banks = {slot.name: slot for slot in model_slots(base) if slot.experts}
    out: dict[str, tuple[int, ...]] = {}
    for name, chosen in experts.items():
        slot = banks[name]
        picked = tuple(sorted(set(chosen)))
        if len(picked) < slot.experts:
            out[slot.parts[0].path] = picked
    return out


def _hold_experts(view: nn.Module, base: nn.Module, params: Mapping[str, torch.Tensor],
                  tensors: Mapping[str, torch.Tensor], held: Mapping[str, tuple[int, ...]]) -> set[str]:
    """Make each bank of ``held`` on ``view`` hold only its experts; the tensor names so served."""
    from weightgraft.engine.moe import hold_experts

    done: set[str] = set()
    for path, experts in held.items():
        own: dict[str, torch.Tensor] = {}
        n_experts = 0
        for name, _ in graftable_state(base.get_submodule(path)):
            full = f"{path}.{name}"
            ref, tensor = params[full], tensors[full]
            n_experts = ref.shape[0]
            if tuple(tensor.shape) == tuple(ref.shape):
                tensor = tensor[list(experts)]
            own[name] = tensor.to(device=ref.device, dtype=ref.dtype).clone()
            done.add(full)
        hold_experts(view.get_submodule(path), experts, own, n_experts)
    return done


class _SafetensorsFiles:
    """The tensors of a model directory's safetensors file(s), read one at a time."""

    def __init__(self, directory: Path, model: nn.Module | None = None) -> None:
        from safetensors import safe_open

        index = directory / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = [p.name for p in sorted(directory.glob("*.safetensors"))]
            if not files:
                raise ModelNotFoundError(f"no safetensors file in {directory}")
        self.handles = {f: safe_open(str(directory / f), framework="pt") for f in files}
        stored = {k: f for f, h in self.handles.items() for k in h.keys()}
        renamed = _renamings(model, stored) if model is not None else {}
        if model is not None and checkpoint_of(model) is not None:  # a language model loaded alone
            renamed = _language_model_names(stored)
        # model name -> (file, name in the file): legacy names renamed as from_pretrained does
        self.where = {renamed.get(k, k): (f, k) for k, f in stored.items()}
        # model name -> (converter, prefix) of a tensor transformers merges from several stored ones
        # (a mixture of experts' bank, stored one tensor per expert); ``where`` lists it with no file
        self.merged = _merged_names(model, self.where) if model is not None else {}
        self.where.update({name: ("", name) for name in self.merged})

    def get(self, name: str) -> torch.Tensor:
        file, key = self.where[name]
        if not file:
            return self._merge(name)
        return self.handles[file].get_tensor(key)

    def _merge(self, name: str) -> torch.Tensor:
        """A merged tensor, built as transformers' own conversion builds it on load: each source
        pattern's stored tensors (expert 0, 1, ... in order) through the converter's operations."""
        converter, prefix = self.merged[name]
        tensors: dict[str, Any] = {}
        for pattern in converter.source_patterns:
            keys: list[str] = [prefix + pattern] if "*" not in pattern else []
            while "*" in pattern and (key := prefix + pattern.replace("*", str(len(keys)))) in self.where:
                keys.append(key)
            tensors[pattern] = [self.get(k) for k in keys]
        for operation in converter.operations:
            tensors = operation.convert(tensors, converter.source_patterns, converter.target_patterns)
        (tensor,) = tensors.values()
        return cast(torch.Tensor, tensor)


def _merged_names(model: nn.Module, where: Mapping[str, object]) -> dict[str, tuple[Any, str]]:
    """Model name -> (converter, prefix) for each tensor that transformers' conversion mapping merges
    from stored ones numbered by ``*`` (an expert bank's ``experts.*.w1.weight``, ...) or named
    apart (OLMo Hybrid's conv kernel, stored as ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``): so a
    lean donor reads it the way loading does. Empty where transformers declares none."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter

        rules = [r for r in get_model_conversion_mapping(cast(Any, model))
                 if isinstance(r, WeightConverter) and len(r.target_patterns) == 1
                 and (all("*" in p for p in r.source_patterns) or not any("*" in p for p in r.source_patterns))]
    except (ImportError, AttributeError, TypeError):  # an internal API of transformers: nothing merged
        return {}
    out: dict[str, tuple[Any, str]] = {}
    for rule in rules:
        first = re.compile(re.escape(rule.source_patterns[0]).replace(r"\*", r"\d+") + "$")
        for stored in where:
            found = first.search(stored)
            if found is None:
                continue
            prefix = stored[: found.start()]
            if "*" in rule.source_patterns[0] or all(prefix + p in where for p in rule.source_patterns):
                out[prefix + rule.target_patterns[0]] = (rule, prefix)
    return out


def _renamings(model: nn.Module, keys: Iterable[str]) -> dict[str, str]:
    """Stored name -> model name under the plain renamings transformers applies on load (e.g.
    GPT-NeoX's ``embed_out`` -> ``lm_head``). Other conversions (merged or split tensors) are
    not followed: their names then do not map, and the caller loads the donor in full."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        rules = [r for r in get_model_conversion_mapping(model) if type(r) is WeightRenaming]
    except (ImportError, AttributeError, TypeError):  # an internal API of transformers: without it, names are taken as stored
        return {}
    out = {}
    for key in keys:
        name = key
        for rule in rules:
            name, _ = rule.rename_source_key(name)
        if name != key:
            out[key] = name
    return out


def _language_model_names(keys: Iterable[str]) -> dict[str, str]:
    """Stored name -> model name for a vision-language checkpoint's language model loaded alone
    (``language_model.model.x`` -> ``model.x``), as its load renames them."""
    from weightgraft.models.vision_language import LANGUAGE_MODEL_KEYS

    out = {}
    for key in keys:
        for pattern, replacement in LANGUAGE_MODEL_KEYS.items():
            name = re.sub(pattern, replacement, key)
            if name != key:
                out[key] = name
                break
    return out


def _file_key(name: str, aliases: Mapping[str, list[str]], keys: Mapping[str, str]) -> str | None:
    for candidate in [name, *aliases.get(name, [])]:
        if candidate in keys:
            return candidate
    return None


@torch.no_grad()
def lean_from_safetensors(
    base: nn.Module, directory: Path, needed: Iterable[str], held: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[nn.Module, str] | None:
    """A donor view of ``base`` holding only the ``needed`` tensors of ``directory``, and the
    donor's ``weights_sha256``: its tensors are streamed one at a time for the hash, and only
    the needed ones are kept (of a bank in ``held``, bank module path -> experts, only those
    experts' slices: ``donor_view``).

    Returns None when the checkpoint's tensor names do not map onto the base's (older key
    layouts): the caller then loads the donor in full, which is never wrong, only heavier."""
    import hashlib

    from transformers import AutoConfig


    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    record = checkpoint_of(base)
    if record is not None:  # the base is a language model loaded alone: so is the donor
        from weightgraft.models.vision_language import load_form, outside_sha256

        config = load_form(config).config
        record = replace(record, outside_sha256=outside_sha256(Path(directory)))
    # a whole vision-language base: where the donor's vision tower differs is recorded on the view,
    # so that the compatibility check reports it (shared with the base, it would look the same)
    outside = adapter_for(projections.hf_config(base)).outside
    differs: str | None = None
    files = _SafetensorsFiles(Path(directory), base)
    aliases = _aliases(base)
    state = base.state_dict(keep_vars=True)
    params = dict(base.named_parameters(remove_duplicate=False))
    needed = set(needed)
    if any(_file_key(name, aliases, files.where) is None for name in needed):
        return None
    # one pass over the donor's tensors, in weights_sha256's (name-sorted) order, keeping the
    # needed ones (a needed tied pair is one stored tensor, read once)
    digest = hashlib.sha256()
    read: dict[str, torch.Tensor] = {}
    loaded: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        ref = state[name]
        if not isinstance(ref, torch.Tensor):
            continue
        key = _file_key(name, aliases, files.where)
        if key is None:
            if name in params:
                return None
            tensor = ref  # a buffer the checkpoint does not store: the config defines it
        else:
            tensor = read.get(key)
            if tensor is None:
                tensor = files.get(key)
                kept = [n for n in aliases.get(name, [name]) if n in needed]
                if kept and not (held and name.rpartition(".")[0] in held):  # a held bank keeps its slices only
                    read[key] = tensor  # kept; any other tensor goes once hashed
            if tuple(tensor.shape) != tuple(ref.shape):
                raise ModelMismatchError(
                    f"tensor {name!r} has shape {list(tensor.shape)} in {directory} but "
                    f"{list(ref.shape)} in the base model: the models do not match"
                )
            if name in needed:
                path = name.rpartition(".")[0]
                loaded[name] = tensor[list(held[path])].clone() if held and path in held else tensor
            elif differs is None and outside and name.startswith(outside) and not torch.equal(tensor.to(ref.dtype), ref):
                differs = name
        hash_tensor(digest, name, tensor.to(ref.dtype))
    view = donor_view(base, loaded, config, held)
    if record is not None:
        setattr(view, CHECKPOINT_ATTR, record)
    setattr(view, OUTSIDE_DIFFERS_ATTR, differs)
    return view, digest.hexdigest()


@dataclass(frozen=True)
class MemoryReport:
    """What a model holds of its own, apart from the base's tensors it shares."""

    bytes_held: int
    tensors_held: int
    tensors_shared: int

    def as_dict(self) -> dict[str, int]:
        return {"bytes_held": self.bytes_held, "tensors_held": self.tensors_held,
                "tensors_shared": self.tensors_shared}


def memory_report(model: nn.Module, base: nn.Module | None = None) -> MemoryReport:
    """Bytes of parameters ``model`` holds that are not storage shared with ``base``."""
    base_ptrs = set() if base is None or base is model else {
        p.untyped_storage().data_ptr() for p in base.parameters()
    }
    held = shared = n_bytes = 0
    seen: set[int] = set()
    for p in model.parameters():
        ptr = p.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        if ptr in base_ptrs:
            shared += 1
        else:
            held += 1
            n_bytes += p.numel() * p.element_size()
    return MemoryReport(n_bytes, held, shared)
