"""Selector expressions: which token positions, which layers, which components.

Positions: span names (``first_actor``: the whole span), ``first_entity`` (the earliest entity
span, whole), ``last``, ``all``, token indices (``0``, ``-2``), the labels of ``wg.tokens`` (one token
each: ``first_entity_last``, ``first_entity_last-2``, ``relation_last+1``, ``tok0``; see
``schemes.labels``), unions ``a+b``, intersections ``a&b``, complements ``~a``, parentheses. A
label's offset is written without spaces (``relation_last+1``); a union with a token index takes
spaces or parentheses (``relation_last + 1``).
Layers and heads: ``weightgraft.schemes.layer_selectors`` (re-exported here).
Components: names and groups joined by ``+`` and ``-`` (``attn+o``, ``all-unembed``).

Each selector is parsed once (``parse_positions``, ``parse_layers``, ``parse_heads``,
``parse_components``, cached by text) into a selection object that every consumer reads;
nothing outside this parser splits a selector's text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weightgraft.engine.architectures import GLOBAL_SLOTS, LAYER_COMPONENTS, MIXER_COMPONENTS
from weightgraft.engine.architectures.adapter import LATENT_COMPONENTS
from weightgraft.schemes.errors import SelectorError as SelectorError
from weightgraft.schemes.labels import (
    FIRST_ENTITY,
    LABEL_ATOM,
    is_label,
    label_position,
    label_span,
    span_tokens,
)
from weightgraft.schemes.labels import (
    LITERAL_SPANS as LITERAL_SPANS,
)
from weightgraft.schemes.labels import (
    SpanNotFound as SpanNotFound,
)
from weightgraft.schemes.labels import (
    first_entity as first_entity,
)
from weightgraft.schemes.labels import (
    token_span as token_span,
)
from weightgraft.schemes.layer_selectors import (
    HeadSelection as HeadSelection,
)
from weightgraft.schemes.layer_selectors import (
    LayerSelection as LayerSelection,
)
from weightgraft.schemes.layer_selectors import (
    check_layer_selector as check_layer_selector,
)
from weightgraft.schemes.layer_selectors import (
    floor_quarter as floor_quarter,
)
from weightgraft.schemes.layer_selectors import (
    layer_group as layer_group,
)
from weightgraft.schemes.layer_selectors import (
    parse_heads as parse_heads,
)
from weightgraft.schemes.layer_selectors import (
    parse_layers as parse_layers,
)
from weightgraft.schemes.layer_selectors import (
    select_heads as select_heads,
)
from weightgraft.schemes.layer_selectors import (
    select_layers as select_layers,
)

# LITERAL_SPANS, SpanNotFound, first_entity and token_span live in schemes.labels; imported from here too


# ---------------------------------------------------------------- positions

_POS_TOKEN = re.compile(rf"\s*(?:(?P<num>-?\d+)|(?P<label>{LABEL_ATOM})|(?P<name>[A-Za-z_]\w*)|(?P<op>[+&~()]))")


def _tokenize(expr: str, pattern: re.Pattern[str], what: str) -> list[tuple[str, str]]:
    out, pos, text = [], 0, expr.strip()
    while pos < len(text):
        m = pattern.match(text, pos)
        if not m or m.end() == pos:
            raise SelectorError(f"cannot parse {what} selector {expr!r} at {text[pos:]!r}")
        kind = next(k for k, v in m.groupdict().items() if v is not None)
        out.append((kind, m.group(kind)))
        pos = m.end()
    if not out:
        raise SelectorError(f"empty {what} selector")
    return out


MAX_DEPTH = 64  # nested ``~`` and parentheses a selector may hold (deeper: refused, not a RecursionError)

# A position selector's tree: ("atom", kind, value) | ("~", node) | ("+" or "&", left, right)
_Node = tuple[Any, ...]


class _Parser:
    """Recursive descent over ``+`` (lowest), ``&``, prefix ``~``, atoms, into a tree."""

    def __init__(self, tokens: list[tuple[str, str]], expr: str) -> None:
        self.tokens, self.i, self.expr, self.depth = tokens, 0, expr, 0

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        tok = self._peek()
        if tok is None:
            raise SelectorError(f"selector {self.expr!r} ends too early")
        self.i += 1
        return tok

    def parse(self) -> _Node:
        result = self._binary("+")
        extra = self._peek()
        if extra is not None:
            raise SelectorError(f"unexpected {extra[1]!r} in selector {self.expr!r}")
        return result

    def _binary(self, op: str) -> _Node:
        result = self._binary("&") if op == "+" else self._unary()
        while self._peek() == ("op", op):
            self._take()
            result = (op, result, self._binary("&") if op == "+" else self._unary())
        return result

    def _unary(self) -> _Node:
        kind, value = self._take()
        if (kind, value) in (("op", "~"), ("op", "(")):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise SelectorError(f"selector nests '~' and parentheses more than {MAX_DEPTH} deep "
                                    f"({len(self.expr)} characters, starting {self.expr[:20]!r})")
            try:
                if value == "~":
                    return ("~", self._unary())
                result = self._binary("+")
                if self._take() != ("op", ")"):
                    raise SelectorError(f"missing ')' in selector {self.expr[:80]!r}")
                return result
            finally:
                self.depth -= 1
        if kind == "op":
            raise SelectorError(f"unexpected {value!r} in selector {self.expr!r}")
        return ("atom", kind, value)


@dataclass(frozen=True)
class PositionSelection:
    """A position selector parsed once (:func:`parse_positions`): its tree, evaluated per prompt."""

    expr: str
    tree: _Node
    atoms: tuple[tuple[str, str], ...]  # (kind, value) of every atom, in order

    def select(self, offsets: Sequence[tuple[int, int]], spans: Mapping[str, tuple[int, int]],
               answer_field: str | None = None) -> list[int]:
        """Token positions (0-based, over the real tokens) selected in one prompt: ``SpanNotFound``
        when a named span is missing or covers no token, or an index falls outside the prompt."""
        n = len(offsets)
        universe = set(range(n))

        def atom(kind: str, value: str) -> set[int]:
            if kind == "num":
                i = int(value)
                if not -n <= i < n:
                    raise SpanNotFound(f"token index {i} is outside a {n}-token prompt")
                return {i % n}
            if value == "all":
                return set(universe)
            if value == "last":
                return {n - 1}
            if value in spans or value == FIRST_ENTITY or not is_label(value):
                return set(span_tokens(value, offsets, spans, answer_field))
            return {label_position(value, offsets, spans, answer_field)}

        def walk(node: _Node) -> set[int]:
            if node[0] == "atom":
                return atom(node[1], node[2])
            if node[0] == "~":
                return universe - walk(node[1])
            left = walk(node[1])
            return left | walk(node[2]) if node[0] == "+" else left & walk(node[2])

        return sorted(walk(self.tree))

    def names(self) -> set[str]:
        """The span / built-in names the selector refers to: a label counts from its span
        (``relation_last+1`` -> ``relation``); ``tok{i}`` is an index."""
        names = set()
        for kind, value in self.atoms:
            if kind in ("name", "label"):
                span = label_span(value) if is_label(value) else value
                if span is not None:
                    names.add(span)
        return names


@functools.lru_cache(maxsize=4096)
def parse_positions(expr: str) -> PositionSelection:
    """``expr`` parsed once into a :class:`PositionSelection`; ``SelectorError`` if malformed."""
    tokens = _tokenize(expr, _POS_TOKEN, "position")
    return PositionSelection(expr, _Parser(tokens, expr).parse(), tuple(t for t in tokens if t[0] != "op"))


def select_positions(
    expr: str,
    offsets: Sequence[tuple[int, int]],
    spans: Mapping[str, tuple[int, int]],
    answer_field: str | None = None,
) -> list[int]:
    """Token positions (0-based, over the real tokens) that ``expr`` selects for one prompt
    (:meth:`PositionSelection.select`); ``SelectorError`` for a malformed expression."""
    return parse_positions(expr).select(offsets, spans, answer_field)


BUILTIN_POSITIONS = frozenset({"all", "last", "first_entity"})


def position_names(expr: str) -> set[str]:
    """The span / built-in names a position selector refers to (checked before any run)."""
    return parse_positions(expr).names()


def unmarked_spans(expr: str, marked: set[str]) -> list[str]:
    """The spans a position selector needs that a prompt marking only ``marked`` lacks
    (``first_entity`` and its labels need any entity span), so that a free prompt is refused before any
    model loads rather than at the first forward pass."""
    missing = []
    for name in sorted(position_names(expr)):
        if name in ("all", "last"):
            continue
        if name == "first_entity":
            if not marked - LITERAL_SPANS:
                missing.append("first_entity (any entity span)")
        elif name not in marked:
            missing.append(name)
    return missing


# ---------------------------------------------------------------- components

_MOE_PARTS = ("router", "experts", "shared_expert_gate", "shared_gate", "shared_up", "shared_down")
COMPONENT_GROUPS: dict[str, tuple[str, ...]] = {
    # the input embedding: tokens, and learned positions where the model has them (GPT-2)
    "embed": ("embed", "pos_embed"),
    # attention's inputs (Qwen3.5's per-head output gate comes out of q_proj with q; gpt-oss's sinks
    # join the query's softmax; DeepSeek's latent attention: its query and key/value projections and norms)
    "attn": ("q", "k", "v", "q_norm", "k_norm", "attn_gate", "sinks", *LATENT_COMPONENTS),
    # a hybrid's recurrent token mixer (in its mixer layers): all of it, and the projections into its conv
    "mixer": MIXER_COMPONENTS,
    "mixer_in": ("mixer_q", "mixer_k", "mixer_v", "mixer_b", "mixer_c", "mixer_x"),
    # a mixture-of-experts layer's MLP is its router, experts and shared experts
    "ffn": ("gate", "up", "act", "down", *_MOE_PARTS),
    "mlp": ("gate", "up", "act", "down", *_MOE_PARTS),
    "shared": ("shared_expert_gate", "shared_gate", "shared_up", "shared_down"),
    "norms": ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm", "k_norm", "mixer_norm",
              "q_a_norm", "kv_a_norm", "ple_norm"),
    "ple": ("ple_gate", "ple_proj", "ple_norm"),  # Gemma 4's per-layer inputs, after the MLP
    "layer": LAYER_COMPONENTS,
    "body": ("embed", "pos_embed", *LAYER_COMPONENTS, "final_norm"),
    "all": ("embed", "pos_embed", *LAYER_COMPONENTS, "final_norm", "unembed"),
}
_KNOWN = set(LAYER_COMPONENTS) | set(GLOBAL_SLOTS)
_COMPONENT_EXPR = re.compile(r"\s*[+-]?\s*[A-Za-z_]+(\s*[+-]\s*[A-Za-z_]+)*\s*")


@dataclass(frozen=True)
class ComponentSelection:
    """A component selector parsed once (:func:`parse_components`): its ``(sign, name)`` terms."""

    expr: str
    terms: tuple[tuple[str, str], ...]

    def named(self) -> set[str]:
        """The names it adds (terms not subtracted), groups as written."""
        return {name for sign, name in self.terms if sign != "-"}

    def resolve(self, available: set[str], groups: Mapping[str, tuple[str, ...]] | None = None) -> set[str]:
        """Canonical component names selected among those the model has.

        A group keeps what the architecture has (``ffn`` on GPT-2 is up+down); a single component
        the architecture lacks is an error where it is added, and removes nothing where it is
        subtracted (``body-down`` on a model whose every MLP is an expert bank is ``body``).
        ``groups`` overrides some groups (a protocol's)."""
        table = {**COMPONENT_GROUPS, **(groups or {})}
        out: set[str] = set()
        for sign, name in self.terms:
            if name in table:
                chosen = set(table[name]) & available
            elif sign == "-" and name not in available:
                chosen = set()  # removing what the model lacks removes nothing (authors' body-down on an all-MoE model)
            else:
                if name not in available:
                    raise SelectorError(f"this architecture has no component {name!r}")
                chosen = {name}
            out = out - chosen if sign == "-" else out | chosen
        if not out:
            raise SelectorError(f"component selector {self.expr!r} selects nothing on this architecture")
        return out


@functools.lru_cache(maxsize=4096)
def parse_components(expr: str) -> ComponentSelection:
    """``expr`` parsed once: a bad expression or a name neither a component nor a group (a
    protocol's groups override these names, never add one) is an error, whatever the architecture."""
    if not _COMPONENT_EXPR.fullmatch(str(expr)):
        raise SelectorError(f"cannot parse component selector {expr!r} (e.g. 'attn+o', 'all-unembed')")
    terms = tuple((sign, name.lower()) for sign, name in re.findall(r"([+-]?)\s*([A-Za-z_]+)", str(expr)))
    for _, name in terms:
        if name not in COMPONENT_GROUPS and name not in _KNOWN:
            raise SelectorError(
                f"unknown component {name!r} in {expr!r}; known: {', '.join(sorted(_KNOWN))}; "
                f"groups: {', '.join(COMPONENT_GROUPS)}"
            )
    return ComponentSelection(str(expr), terms)


def check_component_selector(expr: str) -> None:
    """Refuse a typo (``o+fnn``) when the rule is made, before any model is loaded."""
    parse_components(expr)


def select_components(
    expr: str, available: set[str], groups: Mapping[str, tuple[str, ...]] | None = None,
) -> set[str]:
    """Canonical component names selected by ``expr`` among those the model has
    (:meth:`ComponentSelection.resolve`)."""
    return parse_components(expr).resolve(available, groups)
