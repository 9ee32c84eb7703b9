"""Two readings of the paper's experiments: ``paper`` (what its text describes) and ``authors``
(what the authors' code, toddnief/dynamic-weight-grafting at 8508a57, computes).

Every rule that differs lives in ``PROTOCOLS`` below and is listed, with where it acts, in
``DIFFERENCES`` (docs/paper.md prints the same table with measured effects). Scheme
compilation and the presets read these fields; nothing else branches on the protocol's name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from weightgraft.engine.architectures import LAYER_COMPONENTS
from weightgraft.schemes.selectors import SelectorError

ProtocolName = Literal["paper", "authors"]
# One default for the API, configs, the CLI and explore: the method as the paper's text
# defines it, so a rule grafts what it names (README, "Which protocol").
DEFAULT_PROTOCOL: ProtocolName = "paper"


class Protocol(BaseModel):
    """The switches one protocol sets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ProtocolName
    # Component groups that differ from the defaults in selectors.COMPONENT_GROUPS.
    component_groups: dict[str, tuple[str, ...]]
    # Tied models: wherever ``embed`` is grafted, the unembedding at that position follows it
    # (the authors' code writes the one shared matrix).
    unembed_follows_embed: bool
    # An embedding graft needs per-layer slots in the same rule (the authors' code grafts
    # nothing at a position whose layer list is empty, embeddings included).
    embed_needs_layers: bool
    # Quarters ``n//4`` wide with the remainder in the fourth (else k*n//4 boundaries).
    floor_quarters: bool
    # What complement positions ("other" in the authors' patch configs) receive.
    complement_components: str
    # Layer dropout re-drawn at every grafted token (else one subset per scheme).
    dropout_per_token: bool


PROTOCOLS: dict[str, Protocol] = {
    "paper": Protocol(
        name="paper",
        component_groups={},
        unembed_follows_embed=False,
        embed_needs_layers=False,
        floor_quarters=False,
        complement_components="body",
        dropout_per_token=False,
    ),
    "authors": Protocol(
        name="authors",
        component_groups={
            "embed": ("embed",),  # GPT-2: wte only, never wpe
            "body": ("embed", *LAYER_COMPONENTS),  # never the final norm
            "all": ("embed", *LAYER_COMPONENTS, "unembed"),
        },
        unembed_follows_embed=True,
        embed_needs_layers=True,
        floor_quarters=True,
        complement_components="body-down",
        dropout_per_token=True,
    ),
}


class Difference(BaseModel):
    """One way the two protocols compute differently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str
    paper: str
    authors: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference(topic="unembedding on tied models",
               paper="always the base model's unless a rule grafts `unembed`",
               authors="the donor's at every position whose embedding is grafted (LT, FE+LT, FE^C...)"),
    Difference(topic="final norm", paper="grafted with `body`", authors="never grafted"),
    Difference(topic="GPT-2 `embed`", paper="wte and wpe", authors="wte only"),
    Difference(topic="quarters of n layers", paper="k*n//4 boundaries (30 layers: 22-29 last)",
               authors="n//4 wide, remainder in the fourth (30 layers: 21-29 last)"),
    Difference(topic="complement positions ((FE+LT)^C, LT^C, FE^C)",
               paper="every body slot", authors="every body slot except the FFN down-projection"),
    Difference(topic="embedding without layers", paper="allowed",
               authors="refused: an empty layer list grafts nothing at that position"),
    Difference(topic="component schemes", paper="our names (ATTN+O+FFN, O+FFN, FFN, O, O+FFN-UP, O+FFN-DOWN)",
               authors="their names: attn_ffn (no o), attn_o, attn_o_ffn, o, o_ffn, o_ffn_up, o_ffn_down, ffn; fourth quarter"),
    Difference(topic="hybrid last token",
               paper="task ATTN + relation O+FFN on the last half",
               authors="task q,k,v,gate + relation o,up,down on layers >= n//2 (task on 2*(n//4)..n//2-1)"),
    Difference(topic="layer dropout", paper="one seeded subset of layers per scheme",
               authors="int(rate*len) layers re-drawn at every grafted token (seeded here; unseeded in their code)"),
)


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``; a one-line error otherwise."""
    if name not in PROTOCOLS:
        raise SelectorError(f"unknown protocol {name!r}; use {' or '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def differences_markdown() -> str:
    """The differences as a markdown table (for docs and reports)."""
    lines = ["| topic | paper | authors |", "|---|---|---|"]
    lines += [f"| {d.topic} | {d.paper} | {d.authors} |" for d in DIFFERENCES]
    return "\n".join(lines)


def embeddings_tied(model: object) -> bool:
    """Whether the model's input and output embeddings are one tensor (what ``compile_scheme``
    needs to know as ``tied_embeddings``)."""
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[attr-defined]
    return out is not None and inp.weight is out.weight
