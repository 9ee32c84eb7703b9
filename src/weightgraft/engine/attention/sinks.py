"""Attention sinks (gpt-oss) in the one batched pass, per query row.

A sink is a learned logit per head that joins each query row's softmax as one more column and is
dropped after it, so a row's attention weights sum to less than one. By the per-token definition the
sinks that query position p uses are p's model's, as its q is; keys and values do not see them. The
attention module runs its own forward once (its projections through the engine's swaps, the KV
cache updated once, before the attention function is called); only the attention function is
wrapped: it runs once per model serving some row's sinks, with that model's module and sinks, and
each query row keeps the output of the model serving it. Every row is thus the numbers of the
model's own attention implementation (eager, flash or flex, whichever the model runs), with the
sinks of the row's model, at the cost of one attention call per distinct model in a grafted layer.

The wrapper is reached through transformers' attention registry: for the pass, the attention
module's ``config`` is a view of the model's that names :data:`NAME`; the view carries the plan.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from weightgraft.engine.architectures import Slot
from weightgraft.engine.swaps import Swaps
from weightgraft.errors import UnsupportedArchitectureError

__all__ = ["NAME", "swap_sinks"]

NAME = "weightgraft_sinks"  # the attention implementation the view names for a pass
# what a config assignment must not change on the view (``switch_to_eager`` sets it on every config it finds)
_OWN = frozenset({"_attn_implementation", "_attn_implementation_internal"})


class _SinksConfig:
    """An attention module's config for one pass: the model's own (read through), except that it
    names the wrapping attention function. ``targets``: each model's attention module; ``models``
    ``[batch, seq]``: the model whose sinks serve each query position; ``eager``: the family's eager
    attention function, which transformers falls back to when the model runs ``eager``."""

    def __init__(self, config: Any, targets: list[nn.Module], models: torch.Tensor, eager: Callable[..., Any]) -> None:
        object.__setattr__(self, "wg_plan", (config, targets, models, eager))

    @property
    def _attn_implementation(self) -> str:
        return NAME

    def __getattr__(self, name: str) -> Any:
        plan = self.__dict__.get("wg_plan")
        if plan is None:  # a copy being built: nothing to read through yet
            raise AttributeError(name)
        return getattr(plan[0], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _OWN:  # the implementation is switched (and restored) on the model's own config
            setattr(self.__dict__["wg_plan"][0], name, value)


def _sinks_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's own attention function once per model serving some query row's sinks, each row
    kept from its model's call: ``[batch, q_len, heads, head_dim]`` and the weights where given."""
    view = module.__dict__["config"]
    assert isinstance(view, _SinksConfig)  # only a view names this function
    config, targets, models, eager = view.wg_plan
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager)
    models = models.to(query.device)
    if tuple(models.shape) != (query.shape[0], query.shape[2]):
        raise RuntimeError(f"sinks map {list(models.shape)} does not match the queries {list(query.shape)}")
    present: list[int] = torch.unique(models).tolist()
    module.__dict__["config"] = config  # the implementation reads its own name there (flash)
    try:
        outs = [inner(targets[m], query, key, value, attention_mask, **{**kwargs, "s_aux": targets[m].sinks})
                for m in present]
    finally:
        module.__dict__["config"] = view
    out, weights = outs[0]
    for m, (other, other_weights) in zip(present[1:], outs[1:]):
        rows = models == m  # [batch, q_len]
        out = torch.where(rows[:, :, None, None], other, out)
        if weights is not None and other_weights is not None:  # [batch, heads, q_len, keys]
            weights = torch.where(rows[:, None, :, None], other_weights, weights)
    return out, weights


def _eager(module: nn.Module) -> Callable[..., Any]:
    """The family's own eager attention (``eager_attention_forward`` beside its attention class)."""
    found = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if found is None:
        raise UnsupportedArchitectureError(
            f"{type(module).__name__} has attention sinks but no eager_attention_forward beside it")
    eager: Callable[..., Any] = found
    return eager


def swap_sinks(swap: Swaps, targets: Callable[[str], list[nn.Module]], base: nn.Module, slot_list: list[Slot],
               columns: list[torch.Tensor], donors: list[bool]) -> set[str]:
    """Every attention module whose sinks some donor serves somewhere runs the wrapping attention
    function for the block (its ``config`` a view naming it); returns their paths, which the engine
    must not swap besides (the module's own forward runs, its projections swapped as usual)."""
    taken: set[str] = set()
    for s, slot in enumerate(slot_list):
        if not (slot.sinks and donors[s]):
            continue
        if NAME not in ALL_ATTENTION_FUNCTIONS:
            AttentionInterface.register(NAME, _sinks_attention)
        path = slot.parts[0].path
        module = base.get_submodule(path)
        view = _SinksConfig(module.config, targets(path), columns[s], _eager(module))
        swap.attribute(module, "config", view)
        taken.add(path)
    return taken
