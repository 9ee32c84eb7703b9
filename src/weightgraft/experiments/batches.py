"""A batch that runs out of device memory is split in halves and run again, not lost: the plan
predicts a batch size that fits, and this is what happens where the prediction was wrong (another
process took memory, a longer prompt than planned). Rows are independent of their batch, so the
halves give the rows the whole batch would have; a split is counted in the run's manifest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from weightgraft.experiments.errors import OutOfMemory as OutOfMemory

T = TypeVar("T")
S = TypeVar("S")


def in_halves(chunk: Sequence[S], run: Callable[[Sequence[S]], T], say: Callable[[str], None]) -> tuple[list[T], int]:
    """``[run(chunk)]``, or where it runs out of device memory the results of its halves (split
    again as needed), with the number of splits."""
    try:
        return [run(chunk)], 0
    except torch.cuda.OutOfMemoryError:
        if len(chunk) == 1:
            raise OutOfMemory("one row alone does not fit in the device's memory: free it (another process?) or "
                              "run with a smaller dtype, lean donors or a device_map") from None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        half = len(chunk) // 2
        say(f"a batch of {len(chunk)} rows ran out of device memory: running it as {half} + {len(chunk) - half}")
        first, a = in_halves(chunk[:half], run, say)
        second, b = in_halves(chunk[half:], run, say)
        return first + second, a + b + 1
