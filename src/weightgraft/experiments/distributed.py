"""Sweeps over several processes (``torchrun`` / ``accelerate launch``): who does what.

Each process (rank) computes its share of the sweep's batches and writes its own result
parts; the main rank merges them once every rank is done. Batches are dealt out whole, in the
order a single process would run them, so every row is computed exactly as it would be in a
single-process run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["Ranks", "start"]


@dataclass
class Ranks:
    """This process's place in the run; ``world == 1`` without a launcher."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def device(self, device: str) -> str:
        """A plain ``cuda`` becomes this rank's GPU (``cuda:LOCAL_RANK``)."""
        return f"cuda:{self.local_rank}" if self.world > 1 and device == "cuda" else device

    def total(self, value: int) -> int:
        """``value`` summed over the ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.long)
        if torch.distributed.get_backend() == "nccl":
            t = t.cuda()
        torch.distributed.all_reduce(t)
        return int(t.item())

    def mine(self, batch_index: int) -> bool:
        return batch_index % self.world == self.rank

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            self.owns_group = False


def start(device: str) -> Ranks:
    """Join the process group that ``torchrun`` / ``accelerate launch`` describe in the
    environment (gloo on CPU, nccl on GPUs); a single process when there is none."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group(backend=backend)
        owns = True
    return Ranks(rank, world, local_rank, owns)
