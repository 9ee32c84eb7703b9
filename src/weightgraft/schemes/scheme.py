"""Graft schemes: named lists of rules (positions, layers, components, from-model) over a base
model, compiled per tokenized prompt into the engine's ``source`` tensor."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from weightgraft.engine.architectures import GLOBAL_SLOTS, HEAD_COMPONENTS
from weightgraft.engine.source_map import SlotName
from weightgraft.errors import validation_line
from weightgraft.models.spec import ScaledSpec
from weightgraft.schemes.errors import SchemeInputError as SchemeInputError
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, get_protocol
from weightgraft.schemes.selectors import (
    ComponentSelection,
    LayerSelection,
    PositionSelection,
    SelectorError,
    SpanNotFound,
    parse_components,
    parse_heads,
    parse_layers,
    parse_positions,
)

# The two families a scheme has without a preset (the presets' are in weightgraft.schemes.families):
BASELINE = "baseline"  # a model alone, as ``baselines()`` makes them
CUSTOM = "custom"  # a user's own Scheme; a preset's builder leaves its schemes so and the registry names them


class _Checked(BaseModel):
    """A model built in Python whose bad fields are a :class:`SchemeInputError` in one line (a
    config's are ``ConfigError``: configs validate without calling ``__init__``)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise SchemeInputError(f"{type(self).__name__}: {validation_line(exc)}") from None

    # pydantic then validates nested rules and schemes (a config's) without this __init__, so a
    # config's errors keep their field paths (schemes.0.rules.0.layers) and stay ConfigError
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class Rule(_Checked):
    """Slots ``components`` of layers ``layers`` at ``positions`` come from role ``model``;
    with ``scale`` S they hold ``base + S * (model - base)`` (the scheme's base: 0 is the base, 1
    the graft, 2 doubles the finetune's change, -1 reverses it), served by the role
    ``scaled(model, S, base=BASE)`` that a run builds from the two."""

    model_config = ConfigDict(extra="forbid")

    model: str
    positions: str = "all"
    layers: str = "all"
    components: str = "body"
    # Fraction of the rule's layers left ungrafted: one seeded subset per scheme (protocol
    # paper) or int(rate * n_layers) layers re-drawn at every grafted token (authors).
    layer_dropout: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int = 0
    # Per-head selection (``"0,3"``, ``"0..3"``, ``"all"``) of the q/k/v/o components chosen.
    heads: str | None = None
    # Per-expert selection (``"3,17"``, ``"0..7"``) of a mixture of experts' banks (components=experts).
    experts: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # left out of a dump at 1, so schemes written before it existed keep their identity
    scale: float = Field(default=1.0, exclude_if=lambda v: v == 1.0)

    @field_validator("scale")
    @classmethod
    def _scale_is_finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"scale must be a finite number, got {value}")
        return value

    def role_under(self, base: str) -> str:
        """The role serving this rule's cells in a scheme over ``base``: the rule's model at
        scale 1, the base at 0, else the scaled role's spec text."""
        role = ScaledSpec(self.model, self.scale, base).serving_role()
        return role if isinstance(role, str) else role.text

    @field_validator("layers")
    @classmethod
    def _layers_can_select(cls, value: str) -> str:
        parse_layers(value)
        return value

    @field_validator("components")
    @classmethod
    def _components_are_known(cls, value: str) -> str:
        parse_components(value)
        return value

    # The rule's selectors as the parser reads them (parsed once per text): what compiling reads.
    @property
    def position_selection(self) -> PositionSelection:
        return parse_positions(self.positions)

    @property
    def layer_selection(self) -> LayerSelection:
        return parse_layers(self.layers)

    @property
    def component_selection(self) -> ComponentSelection:
        return parse_components(self.components)


class Scheme(_Checked):
    """A graft plan. Slots no rule claims come from ``base``; later rules win over earlier."""

    model_config = ConfigDict(extra="forbid")

    name: str
    base: str = "pre"
    rules: list[Rule] = Field(default_factory=list)
    family: str = CUSTOM
    # Free labels for reports (e.g. components="O+FFN", layers="last_quarter").
    labels: dict[str, str] = Field(default_factory=dict)

    def roles(self) -> set[str]:
        """The roles serving this scheme's cells (a scaled rule's is its ``scaled(...)`` role)."""
        return {self.base, *(r.role_under(self.base) for r in self.rules)}

    def named_roles(self) -> set[str]:
        """The roles the scheme names, which the models must provide."""
        return {self.base, *(r.model for r in self.rules)}

    def scaled_roles(self) -> dict[str, ScaledSpec]:
        """Role text -> spec of every scaled role this scheme's rules need."""
        return {spec.text: spec for r in self.rules if r.scale not in (0, 1)
                for spec in [ScaledSpec(r.model, r.scale, self.base)]}


def with_scaled_roles(roles: Mapping[str, Any], schemes: Sequence[Scheme]) -> dict[str, Any]:
    """A model set's roles with the scaled roles the schemes need added (named by their text)."""
    out = dict(roles)
    for scheme in schemes:
        for text, spec in scheme.scaled_roles().items():
            out.setdefault(text, spec)
    return out


def baselines(base: str = "pre", donor: str = "sft") -> list[Scheme]:
    """The two ends: the base model alone and the donor model alone (unembedding included)."""
    return [
        Scheme(name=base.upper(), base=base, family=BASELINE, labels={"model": base}),
        Scheme(name=donor.upper(), base=donor, family=BASELINE, labels={"model": donor}),
    ]


@dataclass(frozen=True)
class TokenDropout:
    """Per grafted token, ``int(rate * len(layers))`` whole layers left ungrafted, drawn from
    a generator seeded by the rule's seed, the prompt's offsets and the position."""

    rate: float
    seed: int
    kept: tuple[int, ...]  # slots grafted whatever is dropped (embed, unembed)
    layers: tuple[tuple[int, ...], ...]  # per selected layer, its slots

    def slots_at(self, t: int, offsets: Sequence[tuple[int, int]]) -> list[int]:
        rng = random.Random(f"{self.seed}|{t}|{list(map(tuple, offsets))}")
        dropped = set(rng.sample(range(len(self.layers)), int(self.rate * len(self.layers))))
        return sorted([*self.kept, *(s for i, ls in enumerate(self.layers) if i not in dropped for s in ls)])


@dataclass(frozen=True)
class CompiledRule:
    positions: PositionSelection
    slots: torch.Tensor  # slot indices
    model: int
    heads: dict[int, torch.Tensor] | None = None  # per-head rule: slot index -> head indices
    dropout: TokenDropout | None = None  # slots re-drawn per token (protocol authors)


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
            positions = rule.positions.select(offsets, spans, answer_field)
            if not positions:
                raise SpanNotFound(f"positions {rule.positions.expr!r} select no token here")
            rows = torch.tensor(positions)
            if rule.dropout is not None:
                for t in positions:
                    chosen = rule.dropout.slots_at(t, offsets)
                    src[t, chosen] = rule.model
                    for s in chosen:
                        if s in heads:
                            heads[s][t] = rule.model
                continue
            if rule.heads is None:
                src[rows[:, None], rule.slots[None, :]] = rule.model
                for s in rule.slots.tolist():
                    if s in heads:
                        heads[s][rows] = rule.model
                continue
            for s, head_idx in rule.heads.items():
                if s not in heads:
                    heads[s] = src[:, s : s + 1].repeat(1, self.slot_heads[s])
                heads[s][rows[:, None], head_idx[None, :]] = rule.model
        return src, {self.slot_names[s]: h for s, h in heads.items()}


def _slot_index(slot_names: Sequence[str]) -> tuple[dict[tuple[int, str], int], dict[str, int], int]:
    per_layer: dict[tuple[int, str], int] = {}
    globals_: dict[str, int] = {}
    n_layers = 0
    for i, name in enumerate(slot_names):
        slot = SlotName.parse(name)
        if slot.layer is None:
            globals_[name] = i
        else:
            per_layer[(slot.layer, slot.component)] = i
            n_layers = max(n_layers, slot.layer + 1)
    return per_layer, globals_, n_layers


def compile_scheme(
    scheme: Scheme, slot_names: Sequence[str], roles: Mapping[str, int],
    slot_heads: Mapping[str, int] | None = None, *,
    protocol: str = DEFAULT_PROTOCOL, tied_embeddings: bool = False,
) -> CompiledScheme:
    """Bind ``scheme`` to a model's slots; errors name the scheme and the bad selector.

    ``slot_heads`` (slot name -> number of heads, from ``model_slots``) is needed by rules
    that select heads. ``protocol`` (``weightgraft.schemes.protocol``) sets what groups,
    quarters and dropout mean; ``tied_embeddings`` (the model's input and output embeddings
    are one tensor) matters under ``authors``, where the unembedding follows the embedding."""
    proto = get_protocol(protocol)
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
        where = f"scheme {scheme.name!r}, rule {k}"
        try:
            positions = rule.position_selection
            comps = rule.component_selection.resolve(available, proto.component_groups)
            layers = rule.layer_selection.resolve(n_layers, floor_quarters=proto.floor_quarters)
        except SelectorError as exc:
            raise SelectorError(f"{where}: {exc}") from exc
        per_token = bool(rule.layer_dropout) and proto.dropout_per_token
        if rule.layer_dropout and not per_token:
            rng = random.Random(rule.seed)
            layers = [layer for layer in layers if rng.random() >= rule.layer_dropout]
        by_layer = [tuple(per_layer[(layer, c)] for c in sorted(comps) if (layer, c) in per_layer) for layer in layers]
        by_layer = [ls for ls in by_layer if ls]
        kept = [globals_[c] for c in comps & _global_slots_kept(rule) if c in globals_]
        if "embed" in comps and proto.embed_needs_layers and not by_layer:
            raise SelectorError(
                f"{where}: under protocol {proto.name!r} an embedding graft needs layers in the "
                "same rule (an empty layer list grafts nothing at that position)"
            )
        if "embed" in comps and proto.unembed_follows_embed and tied_embeddings and "unembed" in globals_:
            kept.append(globals_["unembed"])  # one shared matrix: the unembedding follows
        idx = sorted({*kept, *(s for ls in by_layer for s in ls)})
        heads = None
        if rule.heads is not None or rule.experts is not None:
            if per_token:
                raise SelectorError(f"{where}: per-token layer dropout cannot be combined with heads or experts")
            heads = _compile_heads(scheme.name, k, rule, comps=comps, idx=idx, slot_names=slot_names, slot_heads=slot_heads)
        dropout = TokenDropout(rule.layer_dropout, rule.seed, tuple(sorted(set(kept))), tuple(by_layer)) if per_token else None
        rules.append(CompiledRule(positions, torch.tensor(idx, dtype=torch.long), role(rule.role_under(scheme.base)),
                                  heads, dropout))
    counts = tuple((slot_heads or {}).get(name, 0) for name in slot_names)
    return CompiledScheme(scheme.name, role(scheme.base), tuple(rules), len(slot_names), tuple(slot_names), counts)


def _global_slots_kept(rule: Rule) -> set[str]:
    """The slots outside the layers (embedding, final norm, unembedding) a rule may graft.

    A layer selector other than ``all`` means those layers: it keeps only the global slots its
    components name one by one (``layers=29, components=body`` grafts layer 29's slots;
    ``components=body+unembed`` adds the unembedding). With ``layers=all`` the groups' global
    slots come too (``body`` = embed + every layer + final_norm), as in the paper's position
    schemes."""
    if rule.layer_selection.is_all:
        return set(GLOBAL_SLOTS)
    return rule.component_selection.named() & set(GLOBAL_SLOTS)


def _compile_heads(
    scheme: str, k: int, rule: Rule, *, comps: set[str], idx: list[int],
    slot_names: Sequence[str], slot_heads: Mapping[str, int] | None,
) -> dict[int, torch.Tensor]:
    where = f"scheme {scheme!r}, rule {k}"
    if rule.heads is not None and rule.experts is not None:
        raise SelectorError(f"{where}: a rule selects heads or experts, not both")
    units, expr, allowed = ("experts", rule.experts, {"experts"}) if rule.experts is not None else (
        "heads", rule.heads, set(HEAD_COMPONENTS))
    outside = sorted(comps - allowed)
    if outside:
        raise SelectorError(
            f"{where}: {units}={expr!r} applies to {' and '.join(sorted(allowed)) if units == 'experts' else 'q, k, v and o'} "
            f"only, but components {rule.components!r} include {', '.join(outside)}"
        )
    if slot_heads is None:
        raise SelectorError(f"{where}: selects {units}, so compile_scheme needs slot_heads")
    out = {}
    for s in idx:
        name = slot_names[s]
        try:
            chosen = parse_heads(expr or "").resolve(slot_heads[name], SlotName.parse(name).component)
        except SelectorError as exc:
            raise SelectorError(f"{where}: {exc}") from exc
        out[s] = torch.tensor(chosen, dtype=torch.long)
    return out
