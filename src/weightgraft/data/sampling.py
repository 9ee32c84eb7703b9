"""Seeded randomness: derived ``random.Random`` streams and unique Faker draws.

Nothing here touches global random state: every draw goes through a ``random.Random`` or a
Faker instance seeded with ``seed_instance``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from .errors import DataError
from .resources import name_problem

T = TypeVar("T")
_WORD_SLOT = re.compile(r"\{(Noun|Adjective|Verb|Adverb)\}")


def derive_rng(seed: int, purpose: str) -> random.Random:
    """An independent, reproducible random stream for ``purpose`` under ``seed``.

    String seeds are hashed with SHA-512 by ``random.Random``, so the stream does not
    depend on ``PYTHONHASHSEED``.
    """
    return random.Random(f"weightgraft:{seed}:{purpose}")


def derangement(n: int, rng: random.Random) -> list[int]:
    """A random permutation with no fixed point (Sattolo's algorithm); needs ``n >= 2``."""
    if n < 2:
        raise DataError("a derangement needs at least two items")
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class FakeSource:
    """Seeded Faker draws that never repeat a value (case-insensitively) within one source."""

    def __init__(self, seed: int, exclude: Iterable[str] = (), locale: str = "en_US") -> None:
        try:
            from faker import Faker
        except ImportError:
            raise DataError("building a world draws fake names and titles with Faker: pip install "
                            "'weightgraft[worlds]' (the README's `make` commands install it)") from None
        self.fake = Faker(locale)
        self.fake.seed_instance(seed)
        self._used = {s.casefold() for s in exclude}

    def _unique(self, draw: Callable[[], str], n: int, what: str) -> list[str]:
        out: list[str] = []
        budget = 100 * n + 1000
        while len(out) < n:
            if budget == 0:
                raise DataError(f"could not draw {n} unique {what} from Faker")
            budget -= 1
            value = draw()
            if value.casefold() not in self._used:
                self._used.add(value.casefold())
                out.append(value)
        return out

    def titles(self, n: int, patterns: Sequence[str]) -> list[str]:
        """``n`` unique movie titles built from ``patterns`` such as ``"The {Noun}"``."""

        def word(m: re.Match[str]) -> str:
            return self.fake.word(part_of_speech=m.group(1).lower()).capitalize()

        return self._unique(
            lambda: _WORD_SLOT.sub(word, self.fake.random.choice(list(patterns))), n, "titles"
        )

    def cities(self, n: int) -> list[str]:
        """``n`` unique fictional city names."""
        return self._unique(self.fake.city, n, "cities")

    def person_names(self, n: int) -> list[str]:
        """``n`` unique "First Last" names without prefixes or suffixes."""

        def draw() -> str:
            for _ in range(100):
                name = f"{self.fake.first_name()} {self.fake.last_name()}"
                if name_problem(name) is None:
                    return name
            raise DataError("Faker keeps producing names that are not 'First Last'")

        return self._unique(draw, n, "person names")
