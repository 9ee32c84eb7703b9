"""Sizes in bytes, written as a person writes them (``80GiB``, ``24GB``) and back."""

from __future__ import annotations

import re

from weightgraft.planning.errors import PlanError

__all__ = ["gib", "parse_size"]

_UNIT_BYTES = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
               "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """``80GiB``, ``24GB``, ``512MiB``, ``1e9`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNIT_BYTES:
        raise PlanError(f"memory size {text!r}: expected a number with a unit, e.g. 80GiB, 24GB, 512MiB")
    try:
        return int(float(m.group(1)) * _UNIT_BYTES[m.group(2).lower()])
    except ValueError:
        raise PlanError(f"memory size {text!r}: expected a number with a unit, e.g. 80GiB, 24GB, 512MiB") from None


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
