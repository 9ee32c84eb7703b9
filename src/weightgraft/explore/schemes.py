"""The paper's schemes as the page's buttons: position grafts (FE, LT, FE+LT and their
complements, both directions) and component grafts by layer group, each with the spans its
positions need (a button is disabled until the prompt marks them)."""

from __future__ import annotations

from typing import TypedDict

from weightgraft.resume.manifests import Json
from weightgraft.schemes.paper_presets import COMPONENT_SETS, LAYER_GROUPS
from weightgraft.schemes.presets import preset
from weightgraft.schemes.scheme import Scheme
from weightgraft.schemes.selectors import position_names

# what each protocol means, in one line beside every result (schemes/protocol.py lists every difference)
PROTOCOL_MEANING = {
    "paper": "the paper's text: embedding and unembedding graft separately; position schemes graft the final norm with the body",
    "authors": "what the authors' code computed: on tied models the unembedding follows a grafted embedding, the final norm "
               "is never grafted, complements keep the FFN down-projection, quarters are n//4 wide",
}


def _needs(scheme: Scheme) -> list[str]:
    """Spans a scheme's positions name (``first_entity``: any entity span)."""
    names = set().union(*(position_names(r.positions) for r in scheme.rules)) if scheme.rules else set()
    return sorted(names - {"all", "last"})


class SchemeButton(TypedDict):
    """A scheme as the page sends it back to ``/api/graft``."""

    name: str
    base: str
    family: str
    rules: list[Json]  # each rule's fields as written, its model named
    needs: list[str]  # the spans its positions name


class PageSchemes(TypedDict):
    """The page's scheme buttons: preset families by direction, and the names they are built from."""

    position: dict[str, list[SchemeButton]]  # direction (sft2pre, pre2sft) -> schemes
    component: dict[str, list[SchemeButton]]
    component_sets: list[str]
    layer_groups: list[str]
    protocols: dict[str, str]  # protocol -> what it means, in one line


def as_json(scheme: Scheme) -> SchemeButton:
    """A scheme as the page sends it back to ``/api/graft`` (``rules`` and ``base``)."""
    return SchemeButton(name=scheme.name, base=scheme.base, family=scheme.family,
                        rules=[r.model_dump(exclude_defaults=True) | {"model": r.model} for r in scheme.rules],
                        needs=_needs(scheme))


def page_schemes() -> PageSchemes:
    """Preset families by direction: ``sft2pre`` grafts SFT into PRE, ``pre2sft`` PRE into SFT."""
    return PageSchemes(
        position={d: [as_json(s) for s in preset("position", direction=d, spans=True)] for d in ("sft2pre", "pre2sft")},
        component={d: [as_json(s) for s in preset("component", direction=d)] for d in ("sft2pre", "pre2sft")},
        component_sets=list(COMPONENT_SETS), layer_groups=list(LAYER_GROUPS), protocols=PROTOCOL_MEANING,
    )
