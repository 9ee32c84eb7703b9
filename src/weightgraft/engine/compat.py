"""Refuse model sets that cannot be grafted together, naming the first difference."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from weightgraft.engine import lora
from weightgraft.engine.architectures import adapter_for, model_slots
from weightgraft.engine.architectures.slots import graftable_state
from weightgraft.engine.architectures.vision_language import OutsideDifference, outside_differences
from weightgraft.engine.projections import hf_config
from weightgraft.errors import ModelMismatchError as ModelMismatchError

# Config keys that describe bookkeeping, not the computation of a forward pass.
_IGNORED_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "transformers_version",
        "architectures",
        "torch_dtype",
        "dtype",
        "quantization_config",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_attn_implementation_internal",
        "id2label",
        "label2id",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
        "problem_type",
        "tokenizer_class",
        "prefix",
        "finetuning_task",
        "chunk_size_feed_forward",
        "use_return_dict",
        "output_scores",
        "_experts_implementation",
    }
)


def _config_items(model: nn.Module) -> dict[str, Any]:
    return _computed(hf_config(model).to_dict())


def _computed(items: dict[str, Any]) -> dict[str, Any]:
    """A config's entries that change the computation, in nested configs too (a vision-language
    checkpoint's ``text_config``)."""
    return {k: _computed(v) if isinstance(v, dict) and k.endswith("_config") else v
            for k, v in items.items() if k not in _IGNORED_CONFIG_KEYS}


def _named_parameters(model: nn.Module, i: int) -> list[tuple[str, torch.Tensor]]:
    """Parameters by the names of the unwrapped model: a LoRA donor's ``q_proj.base_layer.weight``
    is ``q_proj.weight``, and the adapter's own tensors (``lora_A``, ``lora_B``) are not
    compared (they add to a projection, they do not replace one)."""
    named = graftable_state(model)  # persistent buffers too: a router's correction bias is state
    if not any(lora.canonical_name(n) != n for n, _ in named):
        return named
    lora.check_supported(model, f"models[{i}]")
    return [(c, p) for n, p in named if (c := lora.canonical_name(n)) is not None]


def _compact(model: nn.Module, name: str, tensor: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether ``tensor`` is a lean donor's compact bank tensor standing for ``ref``: its module
    holds some experts (``moe.hold_experts``) and it is ``ref`` with only those (and a zero expert)
    along the experts."""
    from weightgraft.engine.moe import held_experts

    path = name.rpartition(".")[0]
    held = held_experts(model.get_submodule(path)) if path else None
    return held is not None and tuple(tensor.shape) == (len(held) + 1, *ref.shape[1:])


def check_compatible(models: Sequence[nn.Module]) -> None:
    """Raise ``ModelMismatchError`` unless every model matches ``models[0]`` in architecture,
    config, parameter names, shapes, dtypes and device (LoRA donors by the names of the
    projections they wrap). A donor that differs only where no text prompt reaches (a
    vision-language checkpoint's vision tower) is grafted, with an :class:`OutsideDifference`
    warning naming where."""
    base = models[0]
    adapter_for(hf_config(base))
    base_params = _named_parameters(base, 0)
    has_experts = any(slot.experts for slot in model_slots(base))
    base_cfg = _config_items(base)
    for i, other in enumerate(models[1:], start=1):
        if other is base:
            continue
        bt, ot = hf_config(base).model_type, getattr(hf_config(other), "model_type", None)
        if bt != ot:
            raise ModelMismatchError(f"models[{i}] is a {ot!r} model but the base is {bt!r}")
        other_params = dict(_named_parameters(other, i))
        for name, p in base_params:
            q = other_params.pop(name, None)
            if q is None:
                raise ModelMismatchError(f"models[{i}] has no tensor {name!r} (the base has)")
            if q.shape != p.shape and not _compact(other, name, q, p):
                raise ModelMismatchError(
                    f"tensor {name!r} has shape {list(q.shape)} in models[{i}] but "
                    f"{list(p.shape)} in the base (different size or vocabulary)"
                )
            if q.dtype != p.dtype:
                raise ModelMismatchError(
                    f"tensor {name!r} is {q.dtype} in models[{i}] but {p.dtype} in the base; "
                    "load all models in one dtype"
                )
            if q.device != p.device:
                raise ModelMismatchError(
                    f"tensor {name!r} is on {q.device} in models[{i}] but on {p.device} in "
                    "the base; put all models on one device"
                )
        if other_params:
            extra = next(iter(other_params))
            raise ModelMismatchError(f"models[{i}] has a tensor {extra!r} the base lacks")
        mine, theirs = (getattr(hf_config(m), "_experts_implementation", None) for m in (base, other))
        if has_experts and mine != theirs:  # in bfloat16 the two flip routing decisions: one per graft
            raise ModelMismatchError(
                f"models[{i}] runs its experts with {theirs!r} but the base with {mine!r}; give every model one "
                "(model.set_experts_implementation(NAME))"
            )
        other_cfg = _config_items(other)
        for key in sorted(set(base_cfg) | set(other_cfg)):
            if base_cfg.get(key) != other_cfg.get(key):
                raise ModelMismatchError(
                    f"config.{key} is {other_cfg.get(key)!r} in models[{i}] but "
                    f"{base_cfg.get(key)!r} in the base"
                )
    for line in outside_differences(models):
        warnings.warn(line, OutsideDifference, stacklevel=3)
