"""Thread settings for a machine shared with other work.

torch starts one OpenMP thread per core, and OpenMP threads spin while they wait. When
another process keeps a core busy, every step then waits on a descheduled thread, and runs
many times slower (benchmarks/bench_threads.py). weightgraft's commands therefore start
with threads that wait passively and one thread per core left free by the machine's load,
unless the user chose (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ``WEIGHTGRAFT_THREADS``).
"""

from __future__ import annotations

import os


def default_threads() -> int:
    """Cores this process may use, less those the 1-minute load average says are busy."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = int(os.getloadavg()[0])
    except OSError:
        busy = 0
    return max(1, cores - busy)


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
