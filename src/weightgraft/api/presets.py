"""``weightgraft.presets``: the paper's scheme families under short names.

``wg.presets.position()``, ``wg.presets.component(layer_groups=["last_quarter"])``, ... or by
name, ``wg.presets.preset("position", direction="sft2pre")``. Every family registered in
``weightgraft.schemes.families`` is here under its preset name, built as the runner's configs
build it, so both give the same schemes."""

from __future__ import annotations

from typing import Any

from weightgraft.schemes import families

# re-exported as wg.presets.<name> (explicitly, for ruff and mypy)
from weightgraft.schemes.paper_presets import COMPONENT_SETS as COMPONENT_SETS
from weightgraft.schemes.paper_presets import LAYER_GROUPS as LAYER_GROUPS
from weightgraft.schemes.paper_presets import POSITION_SETS as POSITION_SETS
from weightgraft.schemes.paper_presets import SPAN_SETS as SPAN_SETS
from weightgraft.schemes.presets import DIRECTIONS as DIRECTIONS
from weightgraft.schemes.presets import preset as preset
from weightgraft.schemes.scheme import baselines as baselines

_FIXED = ["COMPONENT_SETS", "DIRECTIONS", "LAYER_GROUPS", "POSITION_SETS", "SPAN_SETS", "baselines", "preset"]


def _names() -> list[str]:
    return sorted([*_FIXED, "PRESETS", "PRESET_FAMILIES", *families.presets()])


def __getattr__(name: str) -> Any:
    # read from the registry when asked, so an entry added later is here too
    if name == "__all__":
        return _names()
    if name == "PRESETS":
        return {p: f.builder() for p, f in families.presets().items()}
    if name == "PRESET_FAMILIES":
        return families.preset_families()
    family = families.presets().get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return family.builder()


def __dir__() -> list[str]:
    return sorted({*globals(), *_names()})

