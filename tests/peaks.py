"""Peak resident memory of one call above the level before it (sampled every millisecond), for
the tests that hold the planner's memory terms to what a call holds."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from typing import Any


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_extra(fn: Callable[[], Any]) -> int:
    """The call's peak resident memory above the level before it, freed heap returned first."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    base = rss()
    peak, stop = [base], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample)
    thread.start()
    fn()
    stop.set()
    thread.join()
    return max(peak[0], rss()) - base
