"""Thread settings for a machine shared with other work.

torch starts one OpenMP thread per core, and OpenMP threads spin while they wait: with another
process keeping a core busy, every step then waits on a descheduled thread. weightgraft's
commands start with threads that wait passively, one per available core, unless the user
chose (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ``WEIGHTGRAFT_THREADS``). Measured with
``benchmarks/bench_threads.py`` on 2 cores (ms per forward, idle / one busy competitor): torch
default 126 / 464, passive waits 131 / 330, one thread 248 / 253, one thread per core left free
by the load average 239 / 293 (the load average counts the machine's own recent work, so it
halved the speed of an idle machine: not used).
"""

from __future__ import annotations

import os


def default_threads() -> int:
    """Every core this process may use (waits are passive, so a busy core costs little)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def apply_thread_default() -> int | None:
    """Set the thread default unless the user set one; returns the thread count it chose.

    The OpenMP wait policy is read once, when torch loads: ``weightgraft.entry`` sets it
    before anything imports torch.
    """
    chosen = os.environ.get("WEIGHTGRAFT_THREADS")
    if chosen is None and os.environ.get("OMP_NUM_THREADS"):
        return None  # the user's own choice; torch reads it itself
    threads = int(chosen) if chosen else default_threads()
    import torch

    torch.set_num_threads(threads)
    return threads
