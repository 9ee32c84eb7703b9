"""Grafts wait in one bounded line, and a page's superseded strokes never run: the model runs one
pass at a time, a stroke painted while others wait makes the page's older ones pointless
(latest wins: they leave the line at once, answered 409), a running stroke that a newer one
supersedes stops at its next step (``check``; the pass checks before each layer), and past
``max_waiting`` live requests (superseded ones do not count: a page's newest stroke is never
refused for its own old ones) a request is answered 503 at once rather than piling up."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from weightgraft.explore.requests import RequestError

T = TypeVar("T")
PAGES_KEPT = 256  # pages whose latest stroke number is remembered


@dataclass(eq=False)
class _Stroke:
    """One waiting request (by identity: two requests of no page are two strokes)."""

    page: str | None
    seq: int | None


class StrokeLine:
    """The line grafts wait in (one at a time), with each page's latest stroke number."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._waiting: list[_Stroke] = []  # in order of arrival
        self._changed: anyio.Condition | None = None  # made in the server's event loop, at first use
        self._busy = False
        self._latest: OrderedDict[str, int] = OrderedDict()

    def _note(self, page: str, seq: int) -> None:
        self._latest[page] = max(self._latest.get(page, seq), seq)
        self._latest.move_to_end(page)
        while len(self._latest) > PAGES_KEPT:
            self._latest.popitem(last=False)

    def superseded(self, page: str | None, seq: int | None) -> bool:
        """Whether this page has sent a newer stroke than ``seq``."""
        return page is not None and seq is not None and seq < self._latest.get(page, seq)

    def check(self, page: str | None, seq: int | None) -> Callable[[], None]:
        """What a running stroke calls between its steps (from its worker thread): a 409 once
        the page has sent a newer stroke."""

        def check() -> None:
            if self.superseded(page, seq):
                raise RequestError(f"superseded: this page sent stroke {self._latest.get(page)} after stroke {seq}", 409)

        return check

    def _next(self) -> _Stroke | None:
        """The live stroke that has waited longest."""
        return next((w for w in self._waiting if not self.superseded(w.page, w.seq)), None)

    async def run(self, page: str | None, seq: int | None, job: Callable[[], Awaitable[T]]) -> T:
        """``job()`` once the pass before it is done, unless the line is full (503) or the page
        sent a newer stroke while this one waited (409, as soon as the newer one arrives)."""
        if page is not None and seq is not None:
            self._note(page, seq)
        live = sum(1 for w in self._waiting if not self.superseded(w.page, w.seq))
        if live >= self.max_waiting:
            raise RequestError(f"busy: {live} grafts are already waiting; try again", 503)
        if self._changed is None:
            self._changed = anyio.Condition()
        changed, entry = self._changed, _Stroke(page, seq)
        async with changed:
            changed.notify_all()  # the strokes this one supersedes leave the line now
            self._waiting.append(entry)
            try:
                while (self._busy or self._next() is not entry) and not self.superseded(page, seq):
                    await changed.wait()
            finally:
                self._waiting.remove(entry)
                changed.notify_all()  # (one that gave up leaves the next one first in line)
            self.check(page, seq)()
            self._busy = True
        try:
            return await job()
        finally:
            with anyio.CancelScope(shield=True):
                async with changed:
                    self._busy = False
                    changed.notify_all()
