"""Layer and head selectors, parsed once into selection objects (``weightgraft.schemes.selectors``
is the front door: positions, layers, heads and components).

Layers: ``all``, ``3``, ``-1``, ``2..5`` (inclusive), ``2:6`` (half-open), ``first_half``,
``last_quarter``, ``quarter:2``, ``eighth:7``, ``k/n`` (the k-th of n equal groups), unions ``+``;
under protocol ``authors`` named quarters are ``n//4`` wide with the remainder in the fourth.
Heads (and experts): ``all``, ``3``, ``-1``, ``0..3``, ``0,5,7``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

from weightgraft.schemes.errors import SelectorError

__all__ = ["HeadSelection", "LayerSelection", "check_layer_selector", "floor_quarter", "layer_group", "parse_heads",
           "parse_layers", "select_heads", "select_layers"]

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


@dataclass(frozen=True)
class _LayerTerm:
    """One ``+`` term of a layer selector, read once: ``all``, a group (``k`` of ``n``; ``named``:
    a fraction word, where the authors' floor quarters apply), an inclusive range ``a..b``, a
    half-open slice ``a:b`` (either end open) or one index."""

    text: str
    kind: Literal["all", "group", "range", "slice", "index"]
    a: int | None = None
    b: int | None = None
    named: bool = False

    def resolve(self, n: int, expr: str, floor_quarters: bool) -> list[int]:
        a, b = self.a, self.b
        if self.kind == "all":
            return list(range(n))
        if self.kind == "group":
            assert a is not None and b is not None
            if self.named and floor_quarters and b == 4 and 1 <= a <= 4:
                return floor_quarter(a, n)
            return layer_group(a, b, n)
        if self.kind == "range":
            assert a is not None and b is not None
            return list(range(_layer_index(a, n, expr), _layer_index(b, n, expr) + 1))
        if self.kind == "slice":
            lo = _layer_index(a, n, expr) if a is not None else 0
            hi = n if b is None else (b % n if b < 0 else b)
            if hi > n:
                raise SelectorError(f"layer range {self.text!r} goes beyond the model's depth ({n} layers)")
            return list(range(lo, hi))
        assert a is not None
        return [_layer_index(a, n, expr)]


def _layer_term(term: str, expr: str) -> _LayerTerm:
    """A term read and checked for what it shows without a model (a group that does not exist,
    a range that runs high to low or is empty whatever the depth)."""
    if term == "all":
        return _LayerTerm(term, "all")
    if term in _FRACTIONS:
        return _LayerTerm(term, "group", *_FRACTIONS[term], named=True)
    group: tuple[int, int, bool] | None = None  # (k, of n groups, named)
    if words := re.fullmatch(r"(half|third|quarter|eighth):(\d+)", term):
        group = (int(words.group(2)), _GROUP_WORDS[words.group(1)], True)
    elif fraction := re.fullmatch(r"(\d+)/(\d+)", term):
        group = (int(fraction.group(1)), int(fraction.group(2)), False)
    if group is not None:
        layer_group(group[0], group[1], group[1])  # the group exists
        return _LayerTerm(term, "group", group[0], group[1], named=group[2])
    if bounds := re.fullmatch(r"(-?\d+)(\.\.|:)(-?\d+)", term):
        lo, sep, hi = int(bounds.group(1)), bounds.group(2), int(bounds.group(3))
        if (lo < 0) == (hi < 0) and (lo > hi or (sep == ":" and lo == hi)):
            raise SelectorError(
                f"layer selector {expr!r} (term {term!r}) selects no layer of any model; "
                "ranges run low to high (2..5 inclusive, 2:6 half-open)"
            )
        return _LayerTerm(term, "range" if sep == ".." else "slice", lo, hi)
    if ends := re.fullmatch(r"(-?\d+)?:(-?\d+)?", term):
        start, stop = ends.groups()
        return _LayerTerm(term, "slice", int(start) if start else None, int(stop) if stop else None)
    if re.fullmatch(r"-?\d+", term):
        return _LayerTerm(term, "index", int(term))
    raise SelectorError(
        f"cannot parse layer selector {expr!r} (term {term!r}); use all, 3, -1, 2..5, 2:6, "
        f"{', '.join(sorted(_FRACTIONS))}, quarter:K, eighth:K or K/N"
    )


@dataclass(frozen=True)
class LayerSelection:
    """A layer selector parsed once (:func:`parse_layers`), resolved per model depth."""

    expr: str
    terms: tuple[_LayerTerm, ...]

    @property
    def is_all(self) -> bool:
        """Whether it is ``all`` alone (a rule's global slots follow its groups only then)."""
        return [t.kind for t in self.terms] == ["all"]

    def resolve(self, n_layers: int, *, floor_quarters: bool = False) -> list[int]:
        """Layer indices selected in a model of depth ``n_layers``; ``floor_quarters`` (protocol
        ``authors``): named quarters follow ``floor_quarter``; halves are ``n//2`` either way."""
        out: set[int] = set()
        for term in self.terms:
            chosen = term.resolve(n_layers, self.expr, floor_quarters)
            if not chosen:  # e.g. "-1:3": a rule that would graft nothing
                raise SelectorError(
                    f"layer selector {self.expr!r} (term {term.text!r}) selects no layer of this {n_layers}-layer "
                    "model; ranges run low to high (2..5 inclusive, 2:6 half-open)"
                )
            out.update(chosen)
        return sorted(out)


@functools.lru_cache(maxsize=4096)
def parse_layers(expr: str) -> LayerSelection:
    """``expr`` parsed once; the mistakes it shows without a model are refused here, before any
    model loads; what depends on the depth (``40`` in a 30-layer model) at :meth:`LayerSelection.resolve`."""
    return LayerSelection(str(expr), tuple(_layer_term(t.strip(), str(expr)) for t in str(expr).split("+")))


def select_layers(expr: str, n_layers: int, *, floor_quarters: bool = False) -> list[int]:
    """Layer indices that ``expr`` selects in a model of depth ``n_layers`` (:func:`parse_layers`)."""
    return parse_layers(str(expr)).resolve(n_layers, floor_quarters=floor_quarters)


def check_layer_selector(expr: str) -> None:
    """Refuse what a layer selector shows without a model (:func:`parse_layers`)."""
    parse_layers(str(expr))


def _layer_index(i: int, n_layers: int, expr: str) -> int:
    if not -n_layers <= i < n_layers:
        raise SelectorError(f"layer {i} in {expr!r} is beyond the model's depth ({n_layers} layers)")
    return i % n_layers


@dataclass(frozen=True)
class HeadSelection:
    """A head (or expert) selector parsed once (:func:`parse_heads`): its terms as ``(lo, hi)``
    (``None`` for ``all``), resolved per component."""

    expr: str
    terms: tuple[tuple[int, int] | None, ...]

    def resolve(self, n_heads: int, component: str) -> list[int]:
        """Head indices of one component with ``n_heads`` heads."""
        out: set[int] = set()
        for term in self.terms:
            if term is None:
                out.update(range(n_heads))
                continue
            for i in dict.fromkeys(term):
                if not -n_heads <= i < n_heads:
                    raise SelectorError(f"head {i} in {self.expr!r}: component {component!r} has {n_heads} heads")
            out.update(range(term[0] % n_heads, term[1] % n_heads + 1))
        if not out:
            raise SelectorError(f"head selector {self.expr!r} selects no head")
        return sorted(out)


@functools.lru_cache(maxsize=4096)
def parse_heads(expr: str) -> HeadSelection:
    """``all``, ``3``, ``-1``, ``0..3``, ``0,5,7`` (``,`` or ``+`` joins terms), parsed once."""
    terms: list[tuple[int, int] | None] = []
    for term in (t.strip() for t in re.split(r"[,+]", str(expr))):
        m = None if term == "all" else re.fullmatch(r"(-?\d+)(?:\.\.(-?\d+))?", term)
        if term != "all" and not m:
            raise SelectorError(f"cannot parse head selector {expr!r} (term {term!r}); use all, 3, -1, 0..3 or 0,5,7")
        terms.append(None if m is None else (int(m.group(1)), int(m.group(2) or m.group(1))))
    return HeadSelection(str(expr), tuple(terms))


def select_heads(expr: str, n_heads: int, component: str) -> list[int]:
    """Head indices of one attention component (:func:`parse_heads`)."""
    return parse_heads(expr).resolve(n_heads, component)
