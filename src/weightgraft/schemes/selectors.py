"""Selector expressions: which token positions, which layers, which components.

Positions: span names (``first_actor``: the whole span), ``first_entity`` (the earliest entity
span, whole), ``last``, ``all``, token indices (``0``, ``-2``), the labels of ``wg.tokens`` (one token
each: ``first_entity_last``, ``first_entity_last-2``, ``relation_last+1``, ``tok0``; see
``schemes.labels``), unions ``a+b``, intersections ``a&b``, complements ``~a``, parentheses. A
label's offset is written without spaces (``relation_last+1``); a union with a token index takes
spaces or parentheses (``relation_last + 1``).
Layers: ``all``, ``3``, ``-1``, ``2..5`` (inclusive), ``2:6`` (half-open), ``first_half``,
``last_quarter``, ``quarter:2``, ``eighth:7``, ``k/n`` (the k-th of n equal groups), unions ``+``;
under protocol ``authors`` named quarters are ``n//4`` wide with the remainder in the fourth.
Components: names and groups joined by ``+`` and ``-`` (``attn+o``, ``all-unembed``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from weightgraft.engine.architectures import GLOBAL_SLOTS, LAYER_COMPONENTS, MIXER_COMPONENTS
from weightgraft.engine.architectures.adapter import LATENT_COMPONENTS
from weightgraft.schemes.errors import SelectorError as SelectorError
from weightgraft.schemes.labels import (
    FIRST_ENTITY,
    LABEL_ATOM,
    LITERAL_SPANS as LITERAL_SPANS,
    SpanNotFound as SpanNotFound,
    first_entity as first_entity,
    is_label,
    label_position,
    label_span,
    span_tokens,
    token_span as token_span,
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


class _Parser:
    """Recursive descent over ``+`` (lowest), ``&``, prefix ``~``, atoms."""

    def __init__(self, tokens: list[tuple[str, str]], expr: str, atom: Callable[[str, str], set[int]],
                 universe: set[int]) -> None:
        self.tokens, self.i, self.expr, self.atom, self.universe = tokens, 0, expr, atom, universe
        self.depth = 0

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        tok = self._peek()
        if tok is None:
            raise SelectorError(f"selector {self.expr!r} ends too early")
        self.i += 1
        return tok

    def parse(self) -> set[int]:
        result = self._union()
        extra = self._peek()
        if extra is not None:
            raise SelectorError(f"unexpected {extra[1]!r} in selector {self.expr!r}")
        return result

    def _union(self) -> set[int]:
        result = self._inter()
        while self._peek() == ("op", "+"):
            self._take()
            result = result | self._inter()
        return result

    def _inter(self) -> set[int]:
        result = self._unary()
        while self._peek() == ("op", "&"):
            self._take()
            result = result & self._unary()
        return result

    def _unary(self) -> set[int]:
        kind, value = self._take()
        if (kind, value) in (("op", "~"), ("op", "(")):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise SelectorError(f"selector nests '~' and parentheses more than {MAX_DEPTH} deep "
                                    f"({len(self.expr)} characters, starting {self.expr[:20]!r})")
            try:
                if value == "~":
                    return self.universe - self._unary()
                result = self._union()
                if self._take() != ("op", ")"):
                    raise SelectorError(f"missing ')' in selector {self.expr[:80]!r}")
                return result
            finally:
                self.depth -= 1
        if kind == "op":
            raise SelectorError(f"unexpected {value!r} in selector {self.expr!r}")
        return self.atom(kind, value)


def select_positions(
    expr: str,
    offsets: Sequence[tuple[int, int]],
    spans: Mapping[str, tuple[int, int]],
    answer_field: str | None = None,
) -> list[int]:
    """Token positions (0-based, over the real tokens) that ``expr`` selects for one prompt.

    Raises ``SpanNotFound`` when a named span is missing or covers no token, or an index falls
    outside the prompt; ``SelectorError`` for a malformed expression.
    """
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

    return sorted(_Parser(_tokenize(expr, _POS_TOKEN, "position"), expr, atom, universe).parse())


BUILTIN_POSITIONS = frozenset({"all", "last", "first_entity"})


def position_names(expr: str) -> set[str]:
    """The span / built-in names a position selector refers to (checked before any run): a
    label counts from its span (``relation_last+1`` -> ``relation``); ``tok{i}`` is an index."""
    names = set()
    for kind, value in _tokenize(expr, _POS_TOKEN, "position"):
        if kind in ("name", "label"):
            span = label_span(value) if is_label(value) else value
            if span is not None:
                names.add(span)
    return names


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


# ---------------------------------------------------------------- layers

_FRACTIONS = {
    "first_half": (1, 2), "last_half": (2, 2), "second_half": (2, 2),
    "first_third": (1, 3), "second_third": (2, 3), "last_third": (3, 3),
    "first_quarter": (1, 4), "second_quarter": (2, 4), "third_quarter": (3, 4),
    "last_quarter": (4, 4), "fourth_quarter": (4, 4),
}
_GROUP_WORDS = {"half": 2, "third": 3, "quarter": 4, "eighth": 8}


def layer_group(k: int, n_groups: int, n_layers: int) -> list[int]:
    """Layers of the k-th (1-based) of ``n_groups`` near-equal groups; works for any depth."""
    if not 1 <= k <= n_groups:
        raise SelectorError(f"group {k} of {n_groups} does not exist")
    if n_groups > n_layers:
        raise SelectorError(f"cannot split {n_layers} layers into {n_groups} groups")
    lo, hi = (k - 1) * n_layers // n_groups, k * n_layers // n_groups
    return list(range(lo, hi))


def floor_quarter(k: int, n_layers: int) -> list[int]:
    """The authors' k-th quarter: ``n//4`` layers wide, the remainder in the fourth
    (18 layers: 0-3, 4-7, 8-11, 12-17)."""
    if n_layers < 4:
        raise SelectorError(f"cannot split {n_layers} layers into 4 groups")
    q = n_layers // 4
    return list(range((k - 1) * q, n_layers if k == 4 else k * q))


def select_layers(expr: str, n_layers: int, *, floor_quarters: bool = False) -> list[int]:
    """Layer indices that ``expr`` selects in a model of depth ``n_layers``.

    ``floor_quarters`` (protocol ``authors``): named quarters and ``quarter:K`` follow
    ``floor_quarter``; halves are ``n//2`` either way."""
    out: set[int] = set()
    for term in (t.strip() for t in str(expr).split("+")):
        chosen = _layer_term(term, n_layers, expr, floor_quarters)
        if not chosen:  # e.g. "29..0" or "5:5": a rule that would graft nothing
            raise SelectorError(
                f"layer selector {expr!r} (term {term!r}) selects no layer of this {n_layers}-layer "
                "model; ranges run low to high (2..5 inclusive, 2:6 half-open)"
            )
        out.update(chosen)
    return sorted(out)


def check_layer_selector(expr: str) -> None:
    """The mistakes a layer selector shows without a model: a term that cannot be parsed, a
    group that does not exist (``eighth:9``), a range that runs high to low or is empty
    whatever the depth (``29..0``, ``5:5``). Checked when a rule is made, before any model
    loads; what depends on the depth (``40`` in a 30-layer model) is checked at compile."""
    for term in (t.strip() for t in str(expr).split("+")):
        if term == "all" or term in _FRACTIONS:
            continue
        if m := re.fullmatch(r"(half|third|quarter|eighth):(\d+)", term):
            layer_group(int(m.group(2)), _GROUP_WORDS[m.group(1)], _GROUP_WORDS[m.group(1)])
            continue
        if m := re.fullmatch(r"(\d+)/(\d+)", term):
            layer_group(int(m.group(1)), int(m.group(2)), int(m.group(2)))
            continue
        bounds = re.fullmatch(r"(-?\d+)(\.\.|:)(-?\d+)", term)
        if bounds:
            lo, sep, hi = int(bounds.group(1)), bounds.group(2), int(bounds.group(3))
            if (lo < 0) == (hi < 0) and (lo > hi or (sep == ":" and lo == hi)):
                raise SelectorError(
                    f"layer selector {expr!r} (term {term!r}) selects no layer of any model; "
                    "ranges run low to high (2..5 inclusive, 2:6 half-open)"
                )
            continue
        if re.fullmatch(r"-?\d*:-?\d*|-?\d+", term):
            continue
        raise SelectorError(
            f"cannot parse layer selector {expr!r} (term {term!r}); use all, 3, -1, 2..5, 2:6, "
            f"{', '.join(sorted(_FRACTIONS))}, quarter:K, eighth:K or K/N"
        )


def _layer_index(text: str, n_layers: int, expr: str) -> int:
    i = int(text)
    if not -n_layers <= i < n_layers:
        raise SelectorError(f"layer {i} in {expr!r} is beyond the model's depth ({n_layers} layers)")
    return i % n_layers


def _layer_term(term: str, n: int, expr: str, floor_quarters: bool = False) -> list[int]:
    if term == "all":
        return list(range(n))
    group: tuple[int, int] | None = None
    if term in _FRACTIONS:
        group = _FRACTIONS[term]
    elif m := re.fullmatch(r"(half|third|quarter|eighth):(\d+)", term):
        group = (int(m.group(2)), _GROUP_WORDS[m.group(1)])
    if group is not None:
        if floor_quarters and group[1] == 4 and 1 <= group[0] <= 4:
            return floor_quarter(group[0], n)
        return layer_group(*group, n)
    if m := re.fullmatch(r"(\d+)/(\d+)", term):
        return layer_group(int(m.group(1)), int(m.group(2)), n)
    if m := re.fullmatch(r"(-?\d+)\.\.(-?\d+)", term):
        lo, hi = _layer_index(m.group(1), n, expr), _layer_index(m.group(2), n, expr)
        return list(range(lo, hi + 1))
    if m := re.fullmatch(r"(-?\d*):(-?\d*)", term):
        lo = _layer_index(m.group(1), n, expr) if m.group(1) else 0
        hi = n if not m.group(2) else (int(m.group(2)) % n if int(m.group(2)) < 0 else int(m.group(2)))
        if hi > n:
            raise SelectorError(f"layer range {term!r} goes beyond the model's depth ({n} layers)")
        return list(range(lo, hi))
    if re.fullmatch(r"-?\d+", term):
        return [_layer_index(term, n, expr)]
    raise SelectorError(
        f"cannot parse layer selector {expr!r} (term {term!r}); use all, 3, -1, 2..5, 2:6, "
        f"{', '.join(sorted(_FRACTIONS))}, quarter:K, eighth:K or K/N"
    )


def select_heads(expr: str, n_heads: int, component: str) -> list[int]:
    """Head indices of one attention component: ``all``, ``3``, ``-1``, ``0..3``, ``0,5,7``
    (``,`` or ``+`` joins terms)."""
    out: set[int] = set()
    for term in (t.strip() for t in re.split(r"[,+]", str(expr))):
        if term == "all":
            out.update(range(n_heads))
            continue
        m = re.fullmatch(r"(-?\d+)(?:\.\.(-?\d+))?", term)
        if not m:
            raise SelectorError(f"cannot parse head selector {expr!r} (term {term!r}); use all, 3, -1, 0..3 or 0,5,7")
        ends = [int(g) for g in m.groups() if g is not None]
        for i in ends:
            if not -n_heads <= i < n_heads:
                raise SelectorError(f"head {i} in {expr!r}: component {component!r} has {n_heads} heads")
        lo, hi = ends[0] % n_heads, ends[-1] % n_heads
        out.update(range(lo, hi + 1))
    if not out:
        raise SelectorError(f"head selector {expr!r} selects no head")
    return sorted(out)


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
              "q_a_norm", "kv_a_norm"),
    "layer": LAYER_COMPONENTS,
    "body": ("embed", "pos_embed", *LAYER_COMPONENTS, "final_norm"),
    "all": ("embed", "pos_embed", *LAYER_COMPONENTS, "final_norm", "unembed"),
}
_KNOWN = set(LAYER_COMPONENTS) | set(GLOBAL_SLOTS)
_COMPONENT_EXPR = re.compile(r"\s*[+-]?\s*[A-Za-z_]+(\s*[+-]\s*[A-Za-z_]+)*\s*")


def _component_terms(expr: str, table: Mapping[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """``(sign, name)`` per term; a bad expression or a name neither a component nor a group is
    an error, whatever the architecture."""
    if not _COMPONENT_EXPR.fullmatch(str(expr)):
        raise SelectorError(f"cannot parse component selector {expr!r} (e.g. 'attn+o', 'all-unembed')")
    terms = [(sign, name.lower()) for sign, name in re.findall(r"([+-]?)\s*([A-Za-z_]+)", str(expr))]
    for _, name in terms:
        if name not in table and name not in _KNOWN:
            raise SelectorError(
                f"unknown component {name!r} in {expr!r}; known: {', '.join(sorted(_KNOWN))}; "
                f"groups: {', '.join(COMPONENT_GROUPS)}"
            )
    return terms


def check_component_selector(expr: str) -> None:
    """Refuse a typo (``o+fnn``) when the rule is made, before any model is loaded."""
    _component_terms(expr, COMPONENT_GROUPS)


def select_components(
    expr: str, available: set[str], groups: Mapping[str, tuple[str, ...]] | None = None,
) -> set[str]:
    """Canonical component names selected by ``expr`` among those the model has.

    A group keeps what the architecture has (``ffn`` on GPT-2 is up+down); a single component
    the architecture lacks is an error where it is added, and removes nothing where it is
    subtracted (``body-down`` on a model whose every MLP is an expert bank is ``body``). ``groups`` overrides some groups (a protocol's).
    """
    table = {**COMPONENT_GROUPS, **(groups or {})}
    out: set[str] = set()
    for sign, name in _component_terms(expr, table):
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
        raise SelectorError(f"component selector {expr!r} selects nothing on this architecture")
    return out
