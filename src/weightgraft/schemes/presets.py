"""A preset by name: the registered family's schemes (``weightgraft.schemes.families``) under a
protocol, with roles set by a direction. Configs (``{preset: NAME}``) and ``wg.presets`` call it."""

from __future__ import annotations

from weightgraft.schemes.families import presets
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, get_protocol
from weightgraft.schemes.scheme import Scheme
from weightgraft.schemes.selectors import SelectorError

DIRECTIONS: dict[str, dict[str, str]] = {
    "sft2pre": {"base": "pre", "donor": "sft"},
    "pre2sft": {"base": "sft", "donor": "pre"},
    "both2one": {"base": "one", "donor": "both"},
}


def preset(name: str, protocol: str = DEFAULT_PROTOCOL, **params: object) -> list[Scheme]:
    """A preset family of schemes by name; ``direction=`` sets base and donor roles.

    ``protocol="authors"`` gives the authors' patch configs for the families they ran
    (``weightgraft.schemes.authors_presets``); the others are the same under both."""
    protocol = get_protocol(protocol).name
    by_name = presets()
    if name not in by_name:
        raise SelectorError(f"unknown scheme preset {name!r}; presets: {', '.join(by_name)}")
    build = by_name[name].builder(protocol)
    direction = params.pop("direction", None)
    if direction is not None:
        if direction not in DIRECTIONS:
            raise SelectorError(f"unknown direction {direction!r}; use {', '.join(DIRECTIONS)}")
        params = {**DIRECTIONS[direction], **params}
    try:
        return build(**params)
    except TypeError as exc:
        raise SelectorError(f"preset {name!r}: {exc}") from exc
