"""The memory a run may reach: a given size, a named card, or what this device has free.

Why: on CPU the budget is the available RAM (psutil) plus the process's own resident memory
(which the plan counts as "process before loading"); on CUDA the free GPU memory. Planning for
another machine is ``--memory`` / ``WEIGHTGRAFT_MEMORY`` or ``--gpu CARD``; a CUDA config on a
machine whose torch has no CUDA needs one of them, said in one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from weightgraft.planning.cards import Card
from weightgraft.planning.errors import PlanError
from weightgraft.planning.sizes import parse_size

__all__ = ["Budget", "budget", "cuda_here"]


@dataclass(frozen=True)
class Budget:
    """Bytes a run may reach, bytes the process holds now (counted in the plan), and where the
    budget comes from."""

    limit: int
    held: int
    source: str


def _rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available_ram() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        raise


def cuda_here() -> bool:
    """Whether this process's torch can reach a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def budget(device: str, memory: str | None = None, all_gpus: bool = False, gpu: Card | None = None) -> Budget:
    """A given size (``memory``, else ``WEIGHTGRAFT_MEMORY``), else the card ``gpu``, else this
    device's free memory: with ``all_gpus`` (a ``device_map``) every visible GPU's; on CPU the
    available RAM shared by the processes of this machine (``LOCAL_WORLD_SIZE`` under torchrun:
    each holds its own models)."""
    memory = memory or os.environ.get("WEIGHTGRAFT_MEMORY")
    cuda = device.startswith("cuda")
    if gpu is not None and not cuda:
        raise PlanError(f"--gpu {gpu.name} names a GPU card but the config's device is {device!r}; "
                        "set device=cuda, or give --memory for a CPU machine")
    held = 0 if cuda else _rss()
    if memory:
        return Budget(parse_size(memory), held, f"given: {memory}")
    if gpu is not None:
        return Budget(gpu.memory_bytes, 0, f"card {gpu.name}: {gpu.label}")
    if cuda:
        if not cuda_here():
            raise PlanError(f"device {device!r} but this machine's torch has no CUDA: plan for the GPU machine "
                            "with --gpu CARD (e.g. h100-80gb) or --memory SIZE (e.g. 80GiB)")
        import torch

        devices = range(torch.cuda.device_count()) if all_gpus else [torch.device(device)]
        free = sum(int(torch.cuda.mem_get_info(d)[0]) + int(torch.cuda.memory_allocated(d)) for d in devices)
        return Budget(free, 0, f"free on {'every visible GPU' if all_gpus else device}")
    share = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    where = "available RAM (psutil) + this process" + (f", shared by {share} processes" if share > 1 else "")
    return Budget(_available_ram() // share + held, held, where)
