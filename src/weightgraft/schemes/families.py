"""The names of the preset families: a scheme's ``family`` says which figures draw it
(``weightgraft.report.families.FAMILY_FIGURES``), so presets and report share these constants."""

from __future__ import annotations

BASELINE = "baseline"
POSITION = "position"
COMPONENT = "component"
HYBRID = "hybrid"
UNEMBED = "unembed"
LAYER_DROPOUT = "layer_dropout"
LAYER_WINDOW = "layer_window"
HEAD = "head"
CUSTOM = "custom"  # a user's own Scheme (the default)

PRESET_FAMILIES: tuple[str, ...] = (
    BASELINE, POSITION, COMPONENT, HYBRID, UNEMBED, LAYER_DROPOUT, LAYER_WINDOW, HEAD,
)
