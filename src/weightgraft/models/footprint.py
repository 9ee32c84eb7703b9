"""What a model is, from its config alone: its module tree and shapes on the ``meta`` device,
which of its weights a quantized role stores quantized, and which tensors each slot holds.

Why: ``weightgraft plan`` and the refusal in ``run`` / ``localize`` must answer "will it fit"
before any weight is read. The architecture is built on the ``meta`` device (shapes, no
storage, milliseconds even for 8B parameters), so parameter counts, tied tensors and the
slot -> tensor map come from the very modules the engine will graft, not from a formula. Each
spec kind builds its own footprint (``models.spec``); what a footprint costs in bytes and FLOPs
is planning's arithmetic (``weightgraft.planning.costs``).

A ``quantized(SPEC, SCHEME)`` role has SPEC's shapes; the modules transformers would quantize
are found on the meta model by transformers' own rules (:attr:`ModelFootprint.quantized_shapes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.models.quantization.schemes import quantizes_nothing

__all__ = ["ModelFootprint", "Quantization", "embedded_footprint", "location_footprint",
           "quantization_of", "quantized_footprint", "random_footprint"]

@dataclass(frozen=True)
class Quantization:
    """How a role's linear weights are stored: the scheme (``nf4``, ``fp4``, ``int8``,
    ``torchao-int8``), bitsandbytes' double quantization, and the modules the user keeps
    unquantized (None: transformers' defaults, the output embedding and tied tensors)."""

    scheme: str
    double_quant: bool = False
    skip: tuple[str, ...] | None = None
    bnb: bool = True  # bitsandbytes converts ``nn.Linear`` exactly and GPT-2's ``Conv1D``; torchao any ``nn.Linear``


def quantization_of(spec: Any) -> Quantization:
    """The :class:`Quantization` a quantized spec loads with: its scheme's, or what the user's
    own transformers config (a ``BitsAndBytesConfig``, a ``TorchAoConfig`` of int8 weight-only) says."""
    custom = spec.custom
    if custom is None:
        return Quantization(spec.scheme, bnb=spec.scheme != "torchao-int8")
    kind = type(custom).__name__
    if kind == "BitsAndBytesConfig":
        skip = getattr(custom, "llm_int8_skip_modules", None)
        skip = tuple(skip) if skip is not None else None
        if getattr(custom, "load_in_4bit", False):
            return Quantization(str(custom.bnb_4bit_quant_type), bool(custom.bnb_4bit_use_double_quant), skip)
        if getattr(custom, "load_in_8bit", False):
            return Quantization("int8", skip=skip)
    if kind == "TorchAoConfig" and type(getattr(custom, "quant_type", None)).__name__ == "Int8WeightOnlyConfig" \
            and not getattr(custom, "include_input_output_embeddings", False):
        skip = getattr(custom, "modules_to_not_convert", None)
        return Quantization("torchao-int8", skip=tuple(skip) if skip is not None else None, bnb=False)
    raise ModelLoadError(f"{spec.text!r}: cannot plan a {kind} (the plan counts bitsandbytes 4-bit and 8-bit and "
                         "torchao int8 weight-only); give a scheme name")


def _default_skips(model: Any) -> list[str]:
    """transformers' ``get_keys_to_not_convert``: tied tensors, the last parameter's module and
    the output embedding stay unquantized."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    keys = set(tied) | set(tied.values()) | {list(model.named_parameters())[-1][0]}
    out = model.get_output_embeddings()
    keys |= {name for name, module in model.named_modules() if out is not None and module is out}
    return [k.removesuffix(".weight") for k in keys]


def _converted(name: str, skip: list[str]) -> bool:
    """transformers' ``should_convert_module``: no pattern matches ``name`` from its start (up
    to a module boundary, as a regex) or as a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(re.match(rf"(?:{key}){boundary}", name) or name.endswith(key) for key in skip)


@dataclass
class ModelFootprint:
    """A model's shapes, from its config (no weights read).

    ``where`` says where the config came from; ``tokenizer_dir`` is a directory (or cached hub
    id) a tokenizer can be loaded from without loading the model, or None.
    """

    spec: str
    config: Any
    where: str
    tokenizer_dir: str | None = None
    quantization: Quantization | None = None  # a ``quantized(SPEC, SCHEME)`` role's

    @cached_property
    def meta(self) -> Any:
        """The model on the meta device: real module tree and shapes, no storage."""
        import torch

        form = self.form
        with torch.device("meta"):
            model = form.auto_class().from_config(form.config)
        model.tie_weights()
        return model

    @cached_property
    def form(self) -> Any:
        """What loading builds from this config (``weightgraft.models.vision_language.LoadForm``):
        the config itself, or a vision-language checkpoint's language model alone or whole."""
        from weightgraft.models.vision_language import load_form

        return load_form(self.config)

    # ---- parameters ------------------------------------------------------------------------

    @cached_property
    def n_params(self) -> int:
        """Parameters, tied tensors counted once (what ``model.parameters()`` yields)."""
        return sum(p.numel() for p in self.meta.parameters())

    @cached_property
    def quantized_shapes(self) -> dict[str, tuple[int, int]]:
        """Path -> (out, in) of each module whose weight transformers stores quantized (none
        unquantized): bitsandbytes converts every exact ``nn.Linear`` (and GPT-2's ``Conv1D``),
        torchao every ``nn.Linear``, but those of transformers' ``modules_to_not_convert``."""
        q = self.quantization
        if q is None:
            return {}
        from torch import nn
        from transformers.pytorch_utils import Conv1D

        skip = list(q.skip) if q.skip is not None else _default_skips(self.meta)
        skip += list(getattr(self.meta, "_keep_in_fp32_modules", None) or [])
        out = {}
        for name, module in self.meta.named_modules():
            if not name or not _converted(name, skip):
                continue
            if (type(module) is nn.Linear) if q.bnb else isinstance(module, nn.Linear):
                out[name] = (module.out_features, module.in_features)
            elif q.bnb and isinstance(module, Conv1D):
                out[name] = (module.weight.shape[1], module.weight.shape[0])
        return out

    @cached_property
    def slot_parameters(self) -> dict[str, list[str]]:
        """Slot name -> parameter names its modules hold (as lean donors count them)."""
        from weightgraft.models.lean import slot_parameters

        return slot_parameters(self.meta)

    @cached_property
    def slot_names(self) -> list[str]:
        return list(self.slot_parameters)

    # ---- shapes ----------------------------------------------------------------------------

    def _get(self, *names: str, default: Any = None) -> Any:
        from weightgraft.engine.architectures import text_config

        text = text_config(self.config)  # a vision-language checkpoint's sizes are its language model's
        for n in names:
            value = getattr(text, n, None)
            if value is not None:
                return value
        return default

    @property
    def hidden(self) -> int:
        return int(self._get("hidden_size", "n_embd"))

    @property
    def layers(self) -> int:
        return int(self._get("num_hidden_layers", "n_layer"))

    @property
    def heads(self) -> int:
        return int(self._get("num_attention_heads", "n_head"))

    @property
    def kv_heads(self) -> int:
        return int(self._get("num_key_value_heads", default=self.heads))

    @property
    def head_dim(self) -> int:
        return int(self._get("head_dim", default=self.hidden // self.heads))

    @property
    def intermediate(self) -> int:
        return int(self._get("intermediate_size", "n_inner", default=4 * self.hidden))

    @property
    def vocab(self) -> int:
        return int(self._get("vocab_size"))

    @cached_property
    def matmul_params(self) -> int:
        """Parameters of the matrices a token multiplies by in the layers (not the embedding
        lookup, not the unembedding: those are counted per logit position)."""
        from weightgraft.engine import projections

        emb = self.meta.get_input_embeddings()
        out = self.meta.get_output_embeddings()
        skip = {id(emb)} | ({id(out)} if out is not None else set())
        total = 0
        for module in self.meta.modules():
            if id(module) in skip or not projections.is_projection(module):
                continue
            total += module.weight.numel()
        return total

def _check_converts(footprint: ModelFootprint) -> None:
    """A torchao role on a model of no ``nn.Linear`` to convert (GPT-2's projections are
    ``Conv1D``) refused from its config: loaded, it would run unquantized under a quantized name.
    bitsandbytes converts ``Conv1D`` too; what a custom skip list leaves is checked after loading."""
    q = footprint.quantization
    if q is None or q.bnb or footprint.quantized_shapes:
        return
    from transformers.pytorch_utils import Conv1D

    raise quantizes_nothing(footprint.spec, any(isinstance(m, Conv1D) for m in footprint.meta.modules()))


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def quantized_footprint(text: str, inner: ModelFootprint, spec: Any) -> ModelFootprint:
    """A ``quantized(...)`` role's footprint: the named model's shapes, its linear weights
    quantized as ``spec`` (``.scheme``, ``.custom``) says; refused where nothing would convert."""
    footprint = ModelFootprint(text, inner.config, inner.where, inner.tokenizer_dir, quantization=quantization_of(spec))
    _check_converts(footprint)
    return footprint


def random_footprint(spec: Any) -> ModelFootprint:
    """A ``random:`` model's footprint, from its config file."""
    from weightgraft.models.random_models import parse_random_spec, random_config

    parsed = parse_random_spec(spec)
    return ModelFootprint(parsed.text, random_config(parsed), f"config {parsed.config_path}", None)


def embedded_footprint(name: str, text: str) -> ModelFootprint:
    """An embedded model's footprint: its converted config, else the shipped copy of it."""
    from transformers import AutoConfig

    from weightgraft.models.embedded import embedded_cache_dir
    from weightgraft.models.random_models import random_config, shipped_config_path

    directory = embedded_cache_dir(name)
    if (directory / "config.json").is_file():
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        return ModelFootprint(text, config, f"{directory}/config.json", str(directory) if _has_tokenizer(directory) else None)
    shipped = shipped_config_path(name)
    if shipped is not None:  # not converted yet: the shipped copy of its config
        return ModelFootprint(text, random_config(f"random:{name}"), f"shipped config {shipped}", None)
    return location_footprint(text)


def cached_snapshot(hub_id: str) -> Path | None:
    """The folder of a hub id's snapshot in the local Hugging Face cache (the one that holds its
    ``config.json``), found without the network; None where the cache has none. Given the id
    itself, transformers asks the hub first even with ``local_files_only``; given this folder,
    it reads files only."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(hub_id, "config.json")
    except ValueError:  # not a repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def location_footprint(text: str) -> ModelFootprint:
    """The footprint of a model directory, a ``.gguf`` file or a cached hub id, reading its
    config only."""
    from transformers import AutoConfig

    text = text.strip()
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} holds no config.json: cannot plan for it")
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        return ModelFootprint(text, config, f"{path.resolve()}/config.json",
                              str(path) if _has_tokenizer(path) else None)
    if path.is_file() and path.suffix.lower() == ".gguf":
        try:
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as exc:
            raise ModelLoadError(f"cannot read the config of {path} ({exc})") from exc
        return ModelFootprint(text, config, f"gguf metadata {path}", None)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model directory nor a .gguf file: cannot plan for it")
    folder = cached_snapshot(text)
    if folder is None:
        raise ModelNotFoundError(
            f"cannot read the config of {text!r}: it is no random:/embedded name, no path, and "
            "no hub id in the local Hugging Face cache"
        )
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the config of {text!r} in {folder} ({exc})") from exc
    return ModelFootprint(text, config, f"hub-cache:{text}", str(folder) if _has_tokenizer(folder) else None)
