"""Depth sharing across calls: reference rows' states kept from one pass, and later rows of the
same tokens resumed from them.

An interactive session grafts one row after another over the same prompt, each against the
same reference rows (every position from PRE, every position from SFT). ``depth`` recomputes
its reference rows on every call; here one pass keeps them (``keep_states``: every row's logits,
and the kept rows' residual stream entering every layer and their keys and values), and each
later row runs only from where it first differs from the reference that leaves it the least
work (``resume``: layers l.. at positions p.., on the reference's keys and values before p and
its residual stream entering layer l), as ``depth.run_pass`` does. The logits equal those of
``graft_forward`` on the whole row (tests/engine/test_resume.py, float64).

Half-precision models and models whose cache layers prefix sharing has not been checked on
(``prefix.shareable_cache``) cannot resume: ``resumable`` says so, and such rows run whole.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from weightgraft.engine.architectures import Slot, model_slots
from weightgraft.engine.forward import graft_forward
from weightgraft.engine.precision import is_half
from weightgraft.engine.sharing.depth import (
    DepthStart,
    DepthStats,
    ReferenceStates,
    cache_states,
    decoder_blocks,
    depth_start,
    differs,
    run_pass,
    slot_layers,
)
from weightgraft.engine.sharing.prefix import (
    GraftItem,
    checked_unit_widths,
    pad_segments,
    segment,
    shareable_cache,
    wanted_positions,
)
from weightgraft.engine.swaps import swaps
from weightgraft.errors import GraftArgumentError

__all__ = ["KeptStates", "resumable", "keep_states", "resume", "resume_start"]


@dataclass(frozen=True)
class _Model:
    """What a resume needs of the base model, looked up once per call."""

    slot_list: list[Slot]
    slot_index: dict[str, int]
    layers: list[int]
    blocks: nn.ModuleList

    @classmethod
    def of(cls, model: nn.Module) -> _Model:
        slot_list = model_slots(model)
        return cls(slot_list, {s.name: i for i, s in enumerate(slot_list)}, slot_layers(model), decoder_blocks(model))


@dataclass
class KeptStates:
    """Reference rows (all of the same tokens) and their states at every layer."""

    references: list[GraftItem]
    states: ReferenceStates
    models: tuple[int, ...]  # ids of the models the states were computed with
    base: _Model  # their base model's slots and blocks, looked up once for every resume

    def nbytes(self) -> int:
        return self.states.nbytes()


def resumable(model: nn.Module) -> bool:
    """Whether rows of ``model`` can resume from kept states exactly (see the module's docstring)."""
    return not is_half(model) and shareable_cache(model) is not None


def _same_tokens(items: Sequence[GraftItem]) -> None:
    first = list(items[0].input_ids)
    if any(list(item.input_ids) != first for item in items[1:]):
        raise GraftArgumentError("kept states are shared by rows of the same tokens only")


@torch.no_grad()
def keep_states(models: Sequence[nn.Module], items: Sequence[GraftItem], kept: Sequence[int],
                pad_id: int) -> tuple[torch.Tensor, KeptStates]:
    """``[len(items), max n_logits, vocab]`` logits of ``items`` (rows of the same tokens, one
    ``graft_forward`` pass), and the states of rows ``kept`` (indices into ``items``), which
    become references 0.. of later ``resume`` calls in that order."""
    if not items or not kept:
        raise GraftArgumentError("keep_states needs items and at least one of them to keep")
    if not resumable(models[0]):
        raise GraftArgumentError("these models cannot resume from kept states (half precision or an unchecked cache)")
    _same_tokens(items)
    base = _Model.of(models[0])
    slot_index, blocks = base.slot_index, base.blocks
    widths = checked_unit_widths(items, base.slot_list, slot_index)
    rows = torch.as_tensor(list(kept), dtype=torch.long)
    seen: dict[int, torch.Tensor] = {}

    def keep(j: int, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        seen[j] = hidden[rows.to(hidden.device)]

    cache = DynamicCache()  # full layers only: a later row may resume at any position
    k = max(item.n_logits for item in items)
    with swaps() as made:  # the hooks come off however the pass ends
        for j, block in enumerate(blocks):
            made.hook(block, functools.partial(keep, j), pre=True, with_kwargs=True)
        batch = pad_segments([segment(item, 0, len(item), widths, slot_index) for item in items], pad_id, left=False)
        logits = graft_forward(models, batch.input_ids, batch.source_map(models[0]), attention_mask=batch.mask,
                               logit_positions=wanted_positions(items, [0] * len(items), k),
                               past_key_values=cache)
    keys, values = cache_states(cache)
    states = ReferenceStates(
        residuals={r: {j: seen[j][r] for j in range(len(blocks))} for r in range(len(kept))},
        keys=[k[rows.to(k.device)] for k in keys],
        values=[v[rows.to(v.device)] for v in values],
        row_of={r: r for r in range(len(kept))},
    )
    return logits, KeptStates([items[i] for i in kept], states, tuple(id(m) for m in models), base)


def _start(base: _Model, item: GraftItem, kept: KeptStates, widths: dict[str, int]) -> DepthStart:
    _same_tokens([item, *kept.references])
    n_layers = len(base.blocks)
    mine = segment(item, 0, len(item), widths, base.slot_index)
    options = [depth_start(differs(mine, segment(ref, 0, len(ref), widths, base.slot_index), base.slot_index),
                           item.first_logit(), base.layers, n_layers, r) for r, ref in enumerate(kept.references)]
    return min(options, key=lambda s: ((len(item) - s.position) * (n_layers - max(s.layer, 0)), s.reference))


def resume_start(model: nn.Module, item: GraftItem, kept: KeptStates) -> DepthStart:
    """Where ``item`` resumes: its first differing position and layer against the kept
    reference that leaves it the least work (positions x layers to run)."""
    if id(model) != kept.models[0]:
        raise GraftArgumentError("kept states resume rows of the models that computed them")
    base = kept.base
    return _start(base, item, kept, checked_unit_widths([item, *kept.references], base.slot_list, base.slot_index))


@torch.no_grad()
def resume(models: Sequence[nn.Module], item: GraftItem, kept: KeptStates, pad_id: int) -> torch.Tensor:
    """``[1, n_logits, vocab]``: the logits of ``graft_forward`` on ``item`` whole, computed
    from ``resume_start`` on, on the kept reference's states."""
    if tuple(id(m) for m in models) != kept.models or is_half(models[0]):
        raise GraftArgumentError("kept states resume rows of the models that computed them, in full precision")
    base = kept.base
    widths = checked_unit_widths([item, *kept.references], base.slot_list, base.slot_index)
    start = _start(base, item, kept, widths)
    return run_pass(models, [item], [start], states=kept.states, blocks=base.blocks, pad_id=pad_id, k=item.n_logits,
                    widths=widths, slot_index=base.slot_index, stats=DepthStats())
