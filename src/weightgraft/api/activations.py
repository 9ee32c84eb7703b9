"""Activations of a forward pass by slot name: what each graftable module put out and the
residual stream after each decoder block, ``[batch, seq, ...]``.

Forward hooks on the model's own modules: in a grafted pass (``graft_forward``) a module's
hook sees the output the engine put together from the models that serve its rows, so the
names read the grafted computation; on the per-token reference's private model they read
the definition, one position at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from weightgraft.engine.architectures import adapter_for, model_slots
from weightgraft.engine.mixers import MIXER_FORWARDS
from weightgraft.engine.source_map import SlotName
from weightgraft.engine.swaps import swaps
from weightgraft.errors import GraftArgumentError

RESID_POST = "resid_post"


def activation_names(model: nn.Module) -> list[str]:
    """Every name :func:`record` can read on ``model``, in forward order: each slot but the
    unembedding (the logits are returned anyway) and a hybrid's mixer parts that are no module
    output (its conv kernel, decay parameters, gated norm), and ``layers.{i}.resid_post`` after layer
    ``i``'s slots."""
    out: list[str] = []
    previous: int | None = None  # the layer of the last slot named
    for slot in model_slots(model):
        if slot.name == "unembed":
            continue
        if slot.mixer is not None and slot.mixer.component in MIXER_FORWARDS[slot.mixer.kind].own:
            continue  # a mixer's kernel, decay parameters and gated norm put out no [batch, seq] rows of their own
        layer = SlotName.parse(slot.name).layer
        if previous is not None and previous != layer:
            out.append(str(SlotName(RESID_POST, previous)))
        out.append(slot.name)
        previous = layer
    if previous is not None:
        out.append(str(SlotName(RESID_POST, previous)))
    return out


def _targets(model: nn.Module, names: Sequence[str]) -> dict[str, tuple[str, torch.Tensor | None, int]]:
    """name -> (module path, output columns or None, position axis)."""
    adapter = adapter_for(model.config)
    slots = {s.name: s for s in model_slots(model)}
    out: dict[str, tuple[str, torch.Tensor | None, int]] = {}
    for name in names:
        parsed = SlotName.parse(name)
        if parsed.component == RESID_POST and parsed.layer is not None:
            out[name] = (f"{adapter.layers}.{parsed.layer}", None, 1)
            continue
        (part, *more) = slots[name].parts
        if more:  # an embedding made of several modules: their sum is what the model adds
            raise GraftArgumentError(f"slot {name!r} is made of {len(more) + 1} modules; read them one by one")
        out[name] = (part.path, part.columns, part.pos_axis)
    return out


@contextmanager
def record(model: nn.Module, names: Sequence[str]) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Within it, every forward call of ``model`` appends, per name, the activation
    ``[batch, positions, ...]`` (detached); several calls (a KV-cached pass) append several
    chunks along positions."""
    known = set(activation_names(model))
    unknown = [n for n in names if n not in known]
    if unknown:
        sample = ", ".join(sorted(known)[:4])
        raise GraftArgumentError(f"no activation named {unknown[0]!r} on this model (names look like {sample}, ...)")
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    with swaps() as made:  # every hook comes off however the block ends, also mid-registration
        for name, (path, columns, pos_axis) in _targets(model, names).items():
            def hook(_module: nn.Module, _args: tuple[Any, ...], output: Any, name: str = name,
                     columns: torch.Tensor | None = columns, pos_axis: int = pos_axis) -> None:
                value = output[0] if isinstance(output, tuple) else output
                if columns is not None:
                    value = value.index_select(-1, columns.to(value.device))
                seen[name].append(value.detach().movedim(pos_axis, 1))
            made.hook(model.get_submodule(path), hook)
        yield seen


def stacked(seen: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The chunks of each name joined along positions."""
    return {n: torch.cat(chunks, dim=1) for n, chunks in seen.items() if chunks}
