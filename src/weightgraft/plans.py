"""Graft schemes: named lists of rules (positions, layers, components, from-model) over a base
model, compiled per tokenized prompt into the engine's ``source`` tensor."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from weightgraft.architectures import GLOBAL_SLOTS, HEAD_COMPONENTS
from weightgraft.selectors import (
    SelectorError,
    SpanNotFound,
    select_components,
    select_heads,
    select_layers,
    select_positions,
)


class Rule(BaseModel):
    """Slots ``components`` of layers ``layers`` at ``positions`` come from role ``model``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    positions: str = "all"
    layers: str = "all"
    components: str = "body"
    layer_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int = 0
    # Per-head selection (``"0,3"``, ``"0..3"``, ``"all"``) of the q/k/v/o components chosen.
    heads: str | None = None


class Scheme(BaseModel):
    """A graft plan. Slots no rule claims come from ``base``; later rules win over earlier."""

    model_config = ConfigDict(extra="forbid")

    name: str
    base: str = "pre"
    rules: list[Rule] = Field(default_factory=list)
    family: str = "custom"
    # Free labels for reports (e.g. components="O+FFN", layers="last_quarter").
    labels: dict[str, str] = Field(default_factory=dict)

    def roles(self) -> set[str]:
        return {self.base, *(r.model for r in self.rules)}


@dataclass(frozen=True)
class CompiledRule:
    positions: str
    slots: torch.Tensor  # slot indices
    model: int
    heads: dict[int, torch.Tensor] | None = None  # per-head rule: slot index -> head indices


@dataclass(frozen=True)
class CompiledScheme:
    """A scheme bound to one model's slot list and a role -> model-index mapping."""

    name: str
    base: int
    rules: tuple[CompiledRule, ...]
    n_slots: int
    slot_names: tuple[str, ...] = ()
    slot_heads: tuple[int, ...] = ()

    def source(
        self,
        offsets: Sequence[tuple[int, int]],
        spans: Mapping[str, tuple[int, int]],
        answer_field: str | None = None,
    ) -> torch.Tensor:
        """``[n_tokens, n_slots]`` model indices for one prompt; ``SpanNotFound`` if a rule's
        positions cannot be located or come out empty."""
        return self.sources(offsets, spans, answer_field)[0]

    @property
    def per_head(self) -> bool:
        return any(rule.heads for rule in self.rules)

    def sources(
        self,
        offsets: Sequence[tuple[int, int]],
        spans: Mapping[str, tuple[int, int]],
        answer_field: str | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The ``source`` tensor and the engine's ``head_source`` (slot name ->
        ``[n_tokens, heads]``) for one prompt. Rules apply in order, later ones win, whether
        they graft whole slots or single heads."""
        src = torch.full((len(offsets), self.n_slots), self.base, dtype=torch.long)
        heads: dict[int, torch.Tensor] = {}
        for rule in self.rules:
            positions = select_positions(rule.positions, offsets, spans, answer_field)
            if not positions:
                raise SpanNotFound(f"positions {rule.positions!r} select no token here")
            rows = torch.tensor(positions)
            if rule.heads is None:
                src[rows[:, None], rule.slots[None, :]] = rule.model
                for s in rule.slots.tolist():
                    if s in heads:
                        heads[s][rows] = rule.model
                continue
            for s, chosen in rule.heads.items():
                if s not in heads:
                    heads[s] = src[:, s : s + 1].repeat(1, self.slot_heads[s])
                heads[s][rows[:, None], chosen[None, :]] = rule.model
        return src, {self.slot_names[s]: h for s, h in heads.items()}


def _slot_index(slot_names: Sequence[str]) -> tuple[dict[tuple[int, str], int], dict[str, int], int]:
    per_layer: dict[tuple[int, str], int] = {}
    globals_: dict[str, int] = {}
    n_layers = 0
    for i, name in enumerate(slot_names):
        if name in GLOBAL_SLOTS:
            globals_[name] = i
        else:
            _, layer, comp = name.split(".", 2)
            per_layer[(int(layer), comp)] = i
            n_layers = max(n_layers, int(layer) + 1)
    return per_layer, globals_, n_layers


def compile_scheme(
    scheme: Scheme, slot_names: Sequence[str], roles: Mapping[str, int],
    slot_heads: Mapping[str, int] | None = None,
) -> CompiledScheme:
    """Bind ``scheme`` to a model's slots; errors name the scheme and the bad selector.

    ``slot_heads`` (slot name -> number of heads, from ``model_slots``) is needed by rules
    that select heads."""
    per_layer, globals_, n_layers = _slot_index(slot_names)
    available = {c for _, c in per_layer} | set(globals_)

    def role(name: str) -> int:
        if name not in roles:
            raise SelectorError(
                f"scheme {scheme.name!r} uses model role {name!r}; the model set has "
                f"{', '.join(sorted(roles))}"
            )
        return roles[name]

    rules = []
    for k, rule in enumerate(scheme.rules):
        try:
            comps = select_components(rule.components, available)
            layers = select_layers(rule.layers, n_layers)
        except SelectorError as exc:
            raise SelectorError(f"scheme {scheme.name!r}, rule {k}: {exc}") from exc
        if rule.layer_dropout:
            rng = random.Random(rule.seed)
            layers = [layer for layer in layers if rng.random() >= rule.layer_dropout]
        idx = sorted(
            [per_layer[(layer, c)] for layer in layers for c in comps if (layer, c) in per_layer]
            + [globals_[c] for c in comps if c in globals_]
        )
        heads = None
        if rule.heads is not None:
            heads = _compile_heads(scheme.name, k, rule, comps, idx, slot_names, slot_heads)
        rules.append(CompiledRule(rule.positions, torch.tensor(idx, dtype=torch.long), role(rule.model), heads))
    counts = tuple((slot_heads or {}).get(name, 0) for name in slot_names)
    return CompiledScheme(scheme.name, role(scheme.base), tuple(rules), len(slot_names), tuple(slot_names), counts)


def _compile_heads(
    scheme: str, k: int, rule: Rule, comps: set[str], idx: list[int],
    slot_names: Sequence[str], slot_heads: Mapping[str, int] | None,
) -> dict[int, torch.Tensor]:
    where = f"scheme {scheme!r}, rule {k}"
    not_heads = sorted(comps - set(HEAD_COMPONENTS))
    if not_heads:
        raise SelectorError(
            f"{where}: heads={rule.heads!r} applies to q, k, v and o only, but components "
            f"{rule.components!r} include {', '.join(not_heads)}"
        )
    if slot_heads is None:
        raise SelectorError(f"{where}: selects heads, so compile_scheme needs slot_heads")
    out = {}
    for s in idx:
        name = slot_names[s]
        try:
            chosen = select_heads(rule.heads or "", slot_heads[name], name.rsplit(".", 1)[-1])
        except SelectorError as exc:
            raise SelectorError(f"{where}: {exc}") from exc
        out[s] = torch.tensor(chosen, dtype=torch.long)
    return out


# ---------------------------------------------------------------- presets (the paper's)

POSITION_SETS: dict[str, str] = {
    "FE": "first_entity",
    "LT": "last",
    "FE+LT": "first_entity+last",
    "(FE+LT)^C": "~(first_entity+last)",
    "FE^C": "~first_entity",
    "LT^C": "~last",
}
SPAN_SETS: dict[str, str] = {
    "MOVIE": "movie_title",
    "REL": "relation",
    "PREP": "preposition",
    "REL+PREP": "relation+preposition",
}
COMPONENT_SETS: dict[str, str] = {
    "ATTN+FFN": "attn+o+ffn",
    "O+FFN": "o+ffn",
    "FFN": "ffn",
    "O": "o",
    "up+O": "up+o",
    "down+O": "down+o",
}
LAYER_GROUPS: tuple[str, ...] = (
    "all", "first_half", "last_half",
    "first_quarter", "second_quarter", "third_quarter", "last_quarter",
)


def baselines(base: str = "pre", donor: str = "sft") -> list[Scheme]:
    """The two ends: the base model alone and the donor model alone (unembedding included)."""
    return [
        Scheme(name=base.upper(), base=base, family="baseline", labels={"model": base}),
        Scheme(name=donor.upper(), base=donor, family="baseline", labels={"model": donor}),
    ]


def position_schemes(base: str = "pre", donor: str = "sft", spans: bool = False) -> list[Scheme]:
    """Position grafting (Fig. 2): every slot but the unembedding at the chosen positions.

    As in the paper, grafted positions use the donor's embeddings and the base's unembedding.
    """
    sets = dict(POSITION_SETS, **(SPAN_SETS if spans else {}))
    return baselines(base, donor) + [
        Scheme(
            name=name, base=base, family="position", labels={"positions": name},
            rules=[Rule(model=donor, positions=expr, components="body")],
        )
        for name, expr in sets.items()
    ]


def component_schemes(
    base: str = "pre", donor: str = "sft", positions: str = "last",
    layer_groups: Sequence[str] = LAYER_GROUPS,
) -> list[Scheme]:
    """Component grafting at the last token by layer group (Figs. 4, 14, 15)."""
    out = baselines(base, donor)
    for cname, comps in COMPONENT_SETS.items():
        for group in layer_groups:
            out.append(
                Scheme(
                    name=f"{cname}@{group}", base=base, family="component",
                    labels={"components": cname, "layers": group, "positions": positions},
                    rules=[Rule(model=donor, positions=positions, layers=group, components=comps)],
                )
            )
    return out


HYBRID_FE_COMPONENTS: dict[str, str | None] = {
    "none": None, "ATTN": "attn", "O": "o", "FFN": "ffn", "ATTN+O": "attn+o",
    "ATTN+FFN": "attn+ffn", "O+FFN": "o+ffn", "ALL": "body",
}


def hybrid_schemes(
    base: str = "pre", task: str = "task", relation: str = "relation",
    last_layers: str = "last_half",
) -> list[Scheme]:
    """Three-model hybrid (Fig. 5): at the last token the task model's ATTN and the relation
    model's O+FFN on ``last_layers``; at the first entity, task components on all layers."""
    lt_rules = [
        Rule(model=task, positions="last", layers=last_layers, components="attn"),
        Rule(model=relation, positions="last", layers=last_layers, components="o+ffn"),
    ]
    out = [
        Scheme(name=base.upper(), base=base, family="baseline"),
        Scheme(name=relation.upper(), base=relation, family="baseline"),
    ]
    for label, comps in HYBRID_FE_COMPONENTS.items():
        fe = [] if comps is None else [Rule(model=task, positions="first_entity", components=comps)]
        out.append(
            Scheme(
                name=f"FE:{label}", base=base, family="hybrid",
                labels={"fe_components": label}, rules=fe + lt_rules,
            )
        )
    return out


def unembed_schemes(base: str = "pre", donor: str = "sft", positions: str = "first_entity+last") -> list[Scheme]:
    """Where the unembedding comes from: base (the paper's default), donor, donor at LT only."""
    body = Rule(model=donor, positions=positions, components="body")
    return [
        Scheme(name="unembed:base", base=base, family="unembed", rules=[body]),
        Scheme(name="unembed:donor", base=base, family="unembed",
               rules=[body, Rule(model=donor, positions="all", components="unembed")]),
        Scheme(name="unembed:donor@LT", base=base, family="unembed",
               rules=[body, Rule(model=donor, positions="last", components="unembed")]),
    ]


def layer_dropout_schemes(
    base: str = "pre", donor: str = "sft", positions: str = "first_entity+last",
    rates: Sequence[float] = (0.25, 0.5), seeds: Sequence[int] = (0, 1, 2),
) -> list[Scheme]:
    """Position grafting with a seeded random subset of layers left ungrafted."""
    return [
        Scheme(
            name=f"dropout{rate:g}#{seed}", base=base, family="layer_dropout",
            labels={"rate": f"{rate:g}", "seed": str(seed)},
            rules=[Rule(model=donor, positions=positions, components="layer",
                        layer_dropout=rate, seed=seed),
                   Rule(model=donor, positions=positions, components="embed+final_norm")],
        )
        for rate in rates for seed in seeds
    ]


def layer_window_schemes(
    base: str = "pre", donor: str = "sft", positions: Sequence[str] = ("first_entity", "last"),
    n_windows: int = 8, components: str = "layer",
) -> list[Scheme]:
    """Windows of layers (the k-th of ``n_windows`` equal groups, so any depth works) at each
    position set: the data of layer x position heatmaps."""
    if n_windows < 1:
        raise SelectorError("n_windows must be at least 1")
    return [
        Scheme(
            name=f"{pos}@{k}/{n_windows}", base=base, family="layer_window",
            labels={"positions": pos, "layer_start": str(k - 1), "window": f"1/{n_windows}"},
            rules=[Rule(model=donor, positions=pos, layers=f"{k}/{n_windows}", components=components)],
        )
        for pos in positions for k in range(1, n_windows + 1)
    ]


def head_schemes(
    base: str = "pre", donor: str = "sft", n_heads: int | None = None, positions: str = "last",
    layers: str | Sequence[str] = "last_quarter", components: str = "o",
) -> list[Scheme]:
    """One scheme per attention head: that head of ``components`` (q/k/v/o) on ``layers`` at
    ``positions`` from the donor, everything else from the base. ``n_heads`` is the model's
    number of heads (``k``/``v`` with fewer KV heads refuse head indices they lack). A list of
    layer selectors (``["-4", "-3", "-2", "-1"]``) gives one scheme per (layers, head), which
    the report draws as a layer x head grid."""
    if not n_heads or n_heads < 1:
        raise SelectorError("preset 'heads' needs n_heads (the model's number of attention heads)")
    layer_sets = [layers] if isinstance(layers, str) else [str(x) for x in layers]
    if not layer_sets:
        raise SelectorError("preset 'heads' got an empty list of layers")
    return baselines(base, donor) + [
        Scheme(
            name=f"{components}[{h}]@{where}", base=base, family="head",
            labels={"components": components, "head": str(h), "layers": where, "positions": positions},
            rules=[Rule(model=donor, positions=positions, layers=where, components=components, heads=str(h))],
        )
        for where in layer_sets
        for h in range(n_heads)
    ]


PRESETS = {
    "position": position_schemes,
    "component": component_schemes,
    "hybrid": hybrid_schemes,
    "unembed": unembed_schemes,
    "layer_dropout": layer_dropout_schemes,
    "layer_window": layer_window_schemes,
    "heads": head_schemes,
}
DIRECTIONS: dict[str, dict[str, str]] = {
    "sft2pre": {"base": "pre", "donor": "sft"},
    "pre2sft": {"base": "sft", "donor": "pre"},
    "both2one": {"base": "one", "donor": "both"},
}


def preset(name: str, **params: object) -> list[Scheme]:
    """A preset family of schemes by name; ``direction=`` sets base and donor roles."""
    if name not in PRESETS:
        raise SelectorError(f"unknown scheme preset {name!r}; presets: {', '.join(PRESETS)}")
    direction = params.pop("direction", None)
    if direction is not None:
        if direction not in DIRECTIONS:
            raise SelectorError(f"unknown direction {direction!r}; use {', '.join(DIRECTIONS)}")
        params = {**DIRECTIONS[direction], **params}
    try:
        return PRESETS[name](**params)
    except TypeError as exc:
        raise SelectorError(f"preset {name!r}: {exc}") from exc
