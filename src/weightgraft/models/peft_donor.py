"""LoRA donors: a peft adapter grafted as a model of its own, without merging it.

``load_peft(base, DIR)`` injects the adapter saved in ``DIR`` (peft's ``save_pretrained``)
into a structural clone of ``base`` whose every tensor IS the base's (the same Parameter
objects): the donor holds only the adapter's A and B matrices, and its adapted projections
compute ``W x + B A x * scale`` through peft's own layers. The base is never modified (peft
injects in place, so it injects into the clone; the flags it flips are put back).

The engine reads a LoRA layer's weights through ``weightgraft.engine.lora`` (column splits of
fused projections, per-head o, partial deltas), so every path includes the adapter; the
per-token definition refuses LoRA donors and takes :func:`merged_copy` instead.

A base spread over devices by a ``device_map`` (accelerate's hooks on its modules) serves a
LoRA donor too: each adapter's A and B sit on the device of the projection it wraps, and a
wrapped projection that carried a device hook gets one on its wrapper, so the adapter sees its
input where the projection does. Weights offloaded to the meta device are refused.

In a config a role spec ``peft(pre, DIR)`` names the base role and the adapter directory;
it is checked (roles, directory, ``adapter_config.json``, supported options) before any
model loads, and the run's manifest records the adapter and the slots it touches.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from weightgraft.engine import lora
from weightgraft.engine.architectures import model_slots
from weightgraft.models.errors import PeftError
from weightgraft.models.hashing import weights_sha256
from weightgraft.models.lean import _structural_copy, memory_report
from weightgraft.models.loaded import LoadedModel
from weightgraft.resume.manifests import Json

if TYPE_CHECKING:
    import torch

__all__ = [
    "AdapterInfo",
    "PeftError",
    "adapter_info",
    "build_peft",
    "check_adapter_dir",
    "load_peft",
    "merged_copy",
]

# adapter_config.json options that change the computation beyond W x + B A x * scale (or that
# train base tensors, which loading would write into the shared base): refused, with the reason
_REFUSED = {
    "use_dora": "DoRA rescales the merged weight",
    "lora_bias": "a LoRA bias adds to the projection's bias",
    "modules_to_save": "modules_to_save replaces whole modules",
    "trainable_token_indices": "trainable tokens replace embedding rows",
    "target_parameters": "LoRA on bare parameters",
    "layer_replication": "layer replication changes the model's depth",
    "alora_invocation_tokens": "activated LoRA depends on the tokens",
    "use_qalora": "QA-LoRA pools its inputs",
    "megatron_config": "Megatron-parallel LoRA layers",
    "use_bdlora": "block-diagonal LoRA",
    "arrow_config": "Arrow routes between adapters",
    "kasa_config": "KaSA rescales singular values",
    "velora_config": "VeLoRA changes the layer",
    "monteclora_config": "MonteCLoRA samples its weights",
}
_ATTR = "_weightgraft_adapter"


@dataclass(frozen=True)
class AdapterInfo:
    """What a LoRA donor adds to its base, for manifests: the adapter's directory and content
    hash (:func:`weightgraft.models.weights_sha256` of its own tensors as stored), rank, alpha,
    target modules, the modules it wraps and the slots they serve (every other slot of the
    donor computes exactly as the base's); and, once built on a loaded base (:func:`build_peft`),
    that base's source and hash, so that a record names both halves of the donor."""

    path: str
    sha256: str
    rank: int
    lora_alpha: float
    target_modules: list[str]
    modules: list[str]
    slots_touched: list[str]
    n_slots: int
    bytes_held: int
    base_model_name_or_path: str | None = None
    extra: Json = field(default_factory=dict)  # the adapter config's use_rslora, rank_pattern, alpha_pattern where set
    base_source: str = ""
    base_weights_sha256: str = ""

    def identity(self) -> dict[str, dict[str, str]]:
        """The adapter's and the base's source and hash, as a manifest records a model's."""
        return {"adapter": {"source": self.path, "weights_sha256": self.sha256},
                "base": {"source": self.base_source, "weights_sha256": self.base_weights_sha256}}

    def as_dict(self, base_role: str | None = None) -> Json:
        """For a manifest; ``base_role`` names who serves the slots the adapter leaves alone."""
        out = {
            "path": self.path, "sha256": self.sha256, "rank": self.rank, "lora_alpha": self.lora_alpha,
            "target_modules": self.target_modules, "base_model_name_or_path": self.base_model_name_or_path,
            "modules_adapted": len(self.modules), "slots_touched": self.slots_touched,
            "slots_untouched": self.n_slots - len(self.slots_touched), "bytes_held": self.bytes_held,
            **self.extra,
            **({"base_source": self.base_source, "base_weights_sha256": self.base_weights_sha256}
               if self.base_source or self.base_weights_sha256 else {}),
        }
        who = f"the base role {base_role!r}" if base_role else "the base model"
        out["untouched_slots_served_by"] = (
            f"{who}: the adapter touches {len(self.slots_touched)} of {self.n_slots} slots; the donor's "
            "other slots are the base's own tensors (shared, not copied), so grafting them from this "
            "role changes nothing"
        )
        return out


def check_adapter_dir(directory: str | Path) -> Json:
    """The adapter's ``adapter_config.json``, checked before any model loads: a LoRA adapter
    saved with safetensors, with no option the engine does not reproduce."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise PeftError(f"adapter directory {path} does not exist" if not path.exists()
                        else f"{path} is a file; give the adapter's directory (peft's save_pretrained)")
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        raise PeftError(f"{path} has no adapter_config.json: not a peft adapter directory (save one with "
                        "peft_model.save_pretrained(DIR))")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise PeftError(f"{cfg_file} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise PeftError(f"{cfg_file} is not a JSON object")
    kind = str(cfg.get("peft_type", "")).upper()
    if kind != "LORA":
        raise PeftError(f"{path} holds a {cfg.get('peft_type')!r} adapter; only LoRA adapters can be grafted")
    for key, why in _REFUSED.items():
        if cfg.get(key):
            raise PeftError(f"{path}: {key} is set ({why}); only plain LoRA can be grafted: merge the adapter "
                            "and give the merged model instead")
    if cfg.get("bias", "none") != "none":
        raise PeftError(f"{path}: bias={cfg['bias']!r} trains the base's biases; only bias='none' adapters "
                        "can be grafted without a merge")
    if not (path / "adapter_model.safetensors").is_file():
        pickle = (path / "adapter_model.bin").is_file()
        raise PeftError(f"{path} has no adapter_model.safetensors" + (
            " (adapter_model.bin is a pickle, refused as for models: save the adapter again with "
            "safe_serialization=True)" if pickle else ""))
    return cfg


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_peft(base: nn.Module, directory: str | Path, adapter_name: str = "default") -> nn.Module:
    """A LoRA donor: ``base`` with the adapter in ``directory`` (peft's ``save_pretrained``)
    injected into a clone that shares every tensor with ``base``, so that it costs the
    adapter's memory; ``base`` itself is left exactly as it was. Usable next to ``base`` in
    ``wg.graft``, ``wg.compare``, ``wg.graft_forward`` and ``wg.localize``."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    raw = check_adapter_dir(directory)
    path = Path(directory).expanduser().resolve()
    slots = model_slots(base)  # refuses an unsupported architecture before anything is built
    if lora.has_lora(base):
        raise PeftError("the base model already carries LoRA adapters; give the plain pretrained model")
    offloaded = next((n for n, p in base.named_parameters() if p.device.type == "meta"), None)
    if offloaded is not None:
        raise PeftError(f"the base's {offloaded} is offloaded by its device_map (on the meta device); a LoRA "
                        "donor shares the base's tensors: give the base devices with room for all its layers")
    try:
        config = LoraConfig.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as exc:  # missing, unparsable or of unknown fields
        raise PeftError(f"{path}: cannot read adapter_config.json ({_first_line(exc)})") from None
    # the adapter's values are loaded below: no initialisation that could write to base weights
    # (PiSSA / OLoRA / LoFTQ initialisations modify W in place)
    config.init_lora_weights = False
    config.inference_mode = True
    weight = next(base.parameters())
    try:
        stored = load_peft_weights(str(path), device=str(weight.device))
    except (OSError, ValueError, RuntimeError) as exc:  # missing, truncated or not a tensor file
        raise PeftError(f"{path}: cannot read the adapter weights ({_first_line(exc)})") from None
    stored = _adapter_tensors(stored, base, path)
    clone = _structural_copy(base)
    flags = [(p, p.requires_grad) for p in base.parameters()]
    try:
        inject_adapter_in_model(config, clone, adapter_name=adapter_name)
        result = set_peft_model_state_dict(clone, stored, adapter_name=adapter_name)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:  # shapes or names that differ
        raise PeftError(f"{path}: the adapter does not fit the base model ({_first_line(exc)})") from None
    finally:
        for p, flag in flags:  # peft marks every non-adapter parameter frozen: the base's too
            p.requires_grad_(flag)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
    if unexpected or missing:
        what = unexpected[:1] or missing[:1]
        raise PeftError(f"{path}: the adapter's tensors do not match the base model's modules "
                        f"({len(unexpected)} unexpected, {len(missing)} missing, e.g. {what[0]})")
    _place_adapters(clone, base, weight.dtype)
    lora.check_supported(clone, str(path))
    clone.eval()
    modules = [n for n, m in clone.named_modules() if lora.is_lora(m)]
    wrapped = set(modules)
    touched = [s.name for s in slots if any(part.path in wrapped for part in s.parts)]
    targets = raw.get("target_modules")
    info = AdapterInfo(
        path=str(path), sha256=weights_sha256(stored), rank=int(raw.get("r", 0)),
        lora_alpha=float(raw.get("lora_alpha", 0)),
        target_modules=sorted(targets) if isinstance(targets, list) else [str(targets)],
        modules=modules, slots_touched=touched, n_slots=len(slots),
        bytes_held=memory_report(clone, base).bytes_held,
        base_model_name_or_path=raw.get("base_model_name_or_path"),
        extra={k: raw[k] for k in ("use_rslora", "rank_pattern", "alpha_pattern") if raw.get(k)},
    )
    object.__setattr__(clone, _ATTR, info)
    return clone


def _place_adapters(clone: nn.Module, base: nn.Module, dtype: Any) -> None:
    """Every LoRA layer's own tensors frozen, in ``dtype``, on the device of the projection it
    wraps (a ``device_map`` puts projections on several devices). A wrapped projection with
    accelerate's device hook (a dispatched base) leaves its wrapper hook-less, so the adapter
    would get its input on the caller's device: the wrapper gets a device hook of its own.
    The clone's copies of the attributes dispatch_model sets on the base's top module (``to``,
    ``cuda``: closures over the base) are dropped, so that they act on the donor."""
    for module in clone.modules():
        if not lora.is_lora(module):
            continue
        inner = lora.base_layer(module)
        device = next(inner.parameters()).device
        for name, p in module.named_parameters():
            if lora.canonical_name(name) is None:
                p.requires_grad_(False)
                if p.dtype != dtype or p.device != device:
                    p.data = p.data.to(device=device, dtype=dtype)
        if getattr(inner, "_hf_hook", None) is not None and getattr(module, "_hf_hook", None) is None:
            from accelerate.hooks import AlignDevicesHook, add_hook_to_module

            add_hook_to_module(module, AlignDevicesHook(execution_device=device))
    for attr in ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa"):
        if attr in clone.__dict__ and clone.__dict__[attr] is base.__dict__.get(attr):
            del clone.__dict__[attr]


def _adapter_tensors(stored: dict[str, torch.Tensor], base: nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """The adapter's own tensors. peft also saves base tensors next to them (the embedding or
    unembedding when a target is one: ``save_embedding_layers``); loading those would write
    into the base's shared tensors, so each must equal the base's and is then left out."""
    import torch

    params = dict(base.named_parameters(remove_duplicate=False))
    out = {}
    for key, tensor in stored.items():
        name = lora.canonical_name(key)
        if name is None:
            out[key] = tensor
            continue
        name = name.removeprefix("base_model.model.")
        ref = params.get(name)
        if ref is None or ref.shape != tensor.shape or not torch.equal(ref.detach().to(tensor.dtype), tensor):
            raise PeftError(f"{path}: the adapter saves its own {name!r}, "
                            + ("which the base model lacks" if ref is None else "which differs from the base's")
                            + " (trained on another base or with resized embeddings): merge it and give the merged model")
    return out


def adapter_info(model: nn.Module) -> AdapterInfo | None:
    """The adapter a :func:`load_peft` donor carries; None for any other model."""
    return getattr(model, _ATTR, None)


def merged_copy(donor: nn.Module) -> nn.Module:
    """A separate full model equal to the LoRA donor: its adapters merged by peft into copies
    of the wrapped projections (for the per-token definition, or to save a merged model)."""
    out = copy.deepcopy(donor)
    for path, module in list(out.named_modules()):
        if not lora.is_lora(module):
            continue
        module.merge()
        parent, _, attr = path.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, attr, module.get_base_layer())
    out.__dict__.pop(_ATTR, None)
    return out.eval()


def build_peft(spec: Any, base: LoadedModel) -> LoadedModel:
    """The LoRA role ``spec`` (a ``PeftSpec``: its ``directory``) on its loaded base (the donor shares the base's tensors).
    ``weights_sha256`` is the sha256 of the base's weights hash and the adapter's, so a run's
    identity follows both without hashing the base's tensors a second time."""
    model = load_peft(base.model, spec.directory)
    built = adapter_info(model)
    assert built is not None  # load_peft always attaches it
    info = dataclasses.replace(built, base_source=base.source, base_weights_sha256=base.weights_sha256)
    object.__setattr__(model, _ATTR, info)
    digest = hashlib.sha256(f"peft\0{base.weights_sha256}\0{info.sha256}".encode()).hexdigest()
    return LoadedModel(model=model, tokenizer=base.tokenizer, source=f"peft:{info.path} over {base.source}",
                       weights_sha256=digest, spec=spec, adapter=info)
