"""The registry of graft families: one ``Family`` entry per kind of scheme a sweep holds (the
paper's presets, the baselines, a user's own schemes). Configs (``{preset: NAME}``),
``wg.presets``, the report's figures and the results' ``family`` column all read ``FAMILIES``,
so a new family is one entry here (and its builder, wherever it is written)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from weightgraft.schemes.authors_presets import (
    authors_component_schemes,
    authors_hybrid_schemes,
    authors_layer_dropout_schemes,
    authors_position_schemes,
    authors_unembed_schemes,
)
from weightgraft.schemes.paper_presets import (
    component_schemes,
    head_schemes,
    hybrid_schemes,
    layer_dropout_schemes,
    layer_window_schemes,
    position_schemes,
    scale_schemes,
    unembed_schemes,
)
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, ProtocolName, get_protocol
from weightgraft.schemes.scheme import BASELINE, CUSTOM, Scheme

Builder = Callable[..., list[Scheme]]


class Figures(Enum):
    """How the report draws a family (``weightgraft.report.families`` gives each its figures)."""

    BASELINES = "baselines"  # the baselines' bars, where no position family already shows them
    POSITION_BARS = "position_bars"  # bars of the baselines and the family (Fig. 2)
    BARS = "bars"  # bars of the baselines and the family, split into readable charts
    COMPONENT_GRID = "component_grid"  # components x layer groups per position set (Fig. 4)
    LAYER_POSITION_GRID = "layer_position_grid"  # position sets x grafted layers
    HEAD_GRID = "head_grid"  # layer sets x heads, where a sweep covers several layer sets
    HYBRID_BARS = "hybrid_bars"  # a bar per first-entity component set, baselines dashed (Fig. 5)
    SCALE_LINES = "scale_lines"  # per position set, answer probability and fact log-prob against the scale


@dataclass(frozen=True, kw_only=True)
class Family:
    """One kind of scheme. ``name`` is what a scheme's ``family`` says (the results' column);
    ``preset`` the name configs and ``wg.presets`` call its builder by; ``build`` makes its
    schemes under the paper's protocol, ``by_protocol`` where another protocol builds them
    otherwise (the parameters are the preset's)."""

    name: str
    figures: Figures = Figures.BARS
    preset: str | None = None
    build: Builder | None = None
    by_protocol: Mapping[ProtocolName, Builder] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.preset is None) != (self.build is None):
            raise ValueError(f"family {self.name!r}: a preset needs both a name and a builder")
        if self.by_protocol and self.build is None:
            raise ValueError(f"family {self.name!r}: protocol builders without a preset")

    def builder(self, protocol: str = DEFAULT_PROTOCOL) -> Builder:
        """The family's builder under ``protocol``, naming every scheme it makes (its
        baselines keep ``baseline``)."""
        make = self.by_protocol.get(get_protocol(protocol).name, self.build)
        if make is None:
            raise ValueError(f"family {self.name!r} is not a preset")

        @functools.wraps(make)
        def named(*args: object, **params: object) -> list[Scheme]:
            return [s.model_copy(update={"family": self.name}) if s.family == CUSTOM else s
                    for s in make(*args, **params)]

        return named


def _table(*families: Family) -> dict[str, Family]:
    return {f.name: f for f in families}


# In this order the report draws a sweep's families and an unknown preset's error lists them.
FAMILIES: dict[str, Family] = _table(
    Family(name=BASELINE, figures=Figures.BASELINES),
    Family(name="position", preset="position", build=position_schemes,
           by_protocol={"authors": authors_position_schemes}, figures=Figures.POSITION_BARS),
    Family(name="component", preset="component", build=component_schemes,
           by_protocol={"authors": authors_component_schemes}, figures=Figures.COMPONENT_GRID),
    Family(name="hybrid", preset="hybrid", build=hybrid_schemes,
           by_protocol={"authors": authors_hybrid_schemes}, figures=Figures.HYBRID_BARS),
    Family(name="unembed", preset="unembed", build=unembed_schemes,
           by_protocol={"authors": authors_unembed_schemes}),
    Family(name="layer_dropout", preset="layer_dropout", build=layer_dropout_schemes,
           by_protocol={"authors": authors_layer_dropout_schemes}),
    Family(name="layer_window", preset="layer_window", build=layer_window_schemes,
           figures=Figures.LAYER_POSITION_GRID),
    Family(name="head", preset="heads", build=head_schemes, figures=Figures.HEAD_GRID),
    Family(name="scale", preset="scale", build=scale_schemes, figures=Figures.SCALE_LINES),
    Family(name=CUSTOM),
)


def presets() -> dict[str, Family]:
    """The families a name builds (``{preset: NAME}``, ``wg.presets.NAME``), by that name."""
    return {f.preset: f for f in FAMILIES.values() if f.preset is not None}


def preset_families() -> tuple[str, ...]:
    """The ``family`` names the presets' schemes carry: their own and the baselines'."""
    return tuple(f.name for f in FAMILIES.values() if f.preset is not None or f.name == BASELINE)


def drawn_as(figures: Figures) -> tuple[str, ...]:
    """The families the report draws with ``figures``."""
    return tuple(f.name for f in FAMILIES.values() if f.figures is figures)


def __getattr__(name: str) -> tuple[str, ...]:
    # read from the registry when asked, so an entry added later is listed too
    if name == "PRESET_FAMILIES":
        return preset_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
