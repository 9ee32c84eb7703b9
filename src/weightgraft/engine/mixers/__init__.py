"""Recurrent token mixers in the one batched pass: each kind's forward, and the swap that puts it
in place of a mixer layer's module for a grafted pass.

The per-token definition: at position p every weight the mixer applies at step p is p's model's,
and the conv and recurrent states carry earlier positions as their own models computed them. Only
the conv kernel (and its bias) is applied to earlier positions' values, and no weight lives inside
the scan, so one pass computes it exactly: per-token projections and norms by the model serving
each position, the causal conv with each position's own kernel over each position's own-model
inputs, the decay parameters gathered per token, then the model's own scan once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine.architectures import Slot
from weightgraft.engine.architectures.adapter import MixerKind
from weightgraft.engine.mixers import gated_delta, mamba2, short_conv
from weightgraft.engine.swaps import Swaps

__all__ = ["MIXER_FORWARDS", "MixerForward", "swap_mixers"]


@dataclass(frozen=True)
class MixerForward:
    """A mixer kind's batched forward (``build(each model's mixer module, component -> [batch,
    seq] map)``) and the components it computes itself (its kernel, raw parameters, multi-input
    norms); its other components are per-token modules the engine's module swaps serve."""

    build: Callable[[list[nn.Module], Mapping[str, torch.Tensor]], Callable[..., torch.Tensor]]
    own: frozenset[str]
    # run in every pass, no donor serving: the model's own forward departs from the definition somewhere
    # (Mamba2's one-token decode step skips the step floor its batched scan applies)
    always: bool = False


MIXER_FORWARDS: dict[MixerKind, MixerForward] = {
    "short_conv": MixerForward(short_conv.short_conv_forward, short_conv.OWN),
    "gated_delta_net": MixerForward(gated_delta.gated_delta_forward, gated_delta.OWN),
    "olmo_gated_delta_net": MixerForward(gated_delta.olmo_gated_delta_forward, gated_delta.OWN),
    "next_gated_delta_net": MixerForward(gated_delta.next_gated_delta_forward, gated_delta.OWN),
    "mamba2": MixerForward(mamba2.mamba2_forward, mamba2.OWN, always=True),
    # Falcon-H1's step limit is (0, inf) by default: its decode step and its scan agree, as the
    # per-token reference checks; a config with a floor would need ``always`` too (refused until then)
    "falcon_mamba2": MixerForward(mamba2.falcon_mamba2_forward, mamba2.OWN),
}


def swap_mixers(swap: Swaps, targets: Callable[[str], list[nn.Module]], base: nn.Module, slot_list: list[Slot],
                columns: list[torch.Tensor], donors: list[bool], *, padded: bool) -> set[str]:
    """Every mixer some donor serves somewhere, every mixer of a ``padded`` batch and every mixer
    of a kind that runs ``always``, runs its kind's batched forward for the block (transformers zeroes a pad's mixer input, but with a
    biased input projection the conv still reads a pad's bias; the batched forward zeroes the conv
    input, so a row's numbers do not depend on its padding). Returns the module paths the engine
    must not swap besides (the mixer and the parts its forward computes itself)."""
    sites: dict[str, dict[str, int]] = {}
    for s, slot in enumerate(slot_list):
        if slot.mixer is not None:
            sites.setdefault(slot.mixer.path, {})[slot.mixer.component] = s
    taken: set[str] = set()
    for path, components in sites.items():
        site = slot_list[next(iter(components.values()))].mixer
        assert site is not None  # grouped from mixer slots
        kind = MIXER_FORWARDS[site.kind]
        if not padded and not kind.always and not any(donors[s] for s in components.values()):
            continue
        forward = kind.build(targets(path), {c: columns[s] for c, s in components.items()})
        swap.forward(base.get_submodule(path), forward)
        taken.add(path)
        taken.update(p.path for c, s in components.items() if c in kind.own for p in slot_list[s].parts)
    return taken
