"""``weightgraft.presets``: the paper's scheme families under short names.

``wg.presets.position()``, ``wg.presets.component(layer_groups=["last_quarter"])``, ... or by
name, ``wg.presets.preset("position", direction="sft2pre")``. These are the functions the
runner's configs use (``weightgraft.schemes.presets``), so both give the same schemes."""

from __future__ import annotations

from weightgraft.schemes.families import PRESET_FAMILIES
from weightgraft.schemes.presets import (
    COMPONENT_SETS,
    DIRECTIONS,
    LAYER_GROUPS,
    POSITION_SETS,
    PRESETS,
    SPAN_SETS,
    baselines,
    component_schemes,
    head_schemes,
    hybrid_schemes,
    layer_dropout_schemes,
    layer_window_schemes,
    position_schemes,
    preset,
    unembed_schemes,
)

position = position_schemes
component = component_schemes
hybrid = hybrid_schemes
unembed = unembed_schemes
layer_dropout = layer_dropout_schemes
layer_window = layer_window_schemes
heads = head_schemes

__all__ = [
    "COMPONENT_SETS", "DIRECTIONS", "LAYER_GROUPS", "POSITION_SETS", "PRESETS", "PRESET_FAMILIES",
    "SPAN_SETS", "baselines", "component", "heads", "hybrid", "layer_dropout", "layer_window",
    "position", "preset", "unembed",
]
