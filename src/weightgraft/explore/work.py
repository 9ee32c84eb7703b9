"""Grafts wait in one bounded line, and a page's superseded strokes never run: the model runs one
pass at a time, a stroke painted while others wait makes the page's older ones pointless
(latest wins: they are answered 409 without running), and past ``max_waiting`` live requests
(superseded ones do not count: a page's newest stroke is never refused for its own old ones) a
request is answered 503 at once rather than piling up."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from weightgraft.explore.requests import RequestError

T = TypeVar("T")
PAGES_KEPT = 256  # pages whose latest stroke number is remembered


class Work:
    """The line grafts wait in (one at a time), with each page's latest stroke number."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._waiting: list[tuple[str | None, int | None]] = []
        self._lock: anyio.Lock | None = None  # made in the server's event loop, at first use
        self._latest: OrderedDict[str, int] = OrderedDict()

    def _note(self, page: str, seq: int) -> None:
        self._latest[page] = max(self._latest.get(page, seq), seq)
        self._latest.move_to_end(page)
        while len(self._latest) > PAGES_KEPT:
            self._latest.popitem(last=False)

    def superseded(self, page: str | None, seq: int | None) -> bool:
        """Whether this page has sent a newer stroke than ``seq``."""
        return page is not None and seq is not None and seq < self._latest.get(page, seq)

    async def run(self, page: str | None, seq: int | None, job: Callable[[], Awaitable[T]]) -> T:
        """``job()`` once the pass before it is done, unless the line is full (503) or the page
        sent a newer stroke while this one waited (409)."""
        if page is not None and seq is not None:
            self._note(page, seq)
        live = sum(1 for p, s in self._waiting if not self.superseded(p, s))
        if live >= self.max_waiting:
            raise RequestError(f"busy: {live} grafts are already waiting; try again", 503)
        if self._lock is None:
            self._lock = anyio.Lock()
        lock = self._lock
        entry = (page, seq)
        self._waiting.append(entry)
        try:
            await lock.acquire()
        finally:
            self._waiting.remove(entry)
        try:
            if self.superseded(page, seq):
                raise RequestError(f"superseded: this page sent stroke {self._latest[page]} after stroke {seq}", 409)
            return await job()
        finally:
            lock.release()
