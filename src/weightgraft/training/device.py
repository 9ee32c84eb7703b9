"""Which device a finetune trains on: the Trainer takes the first visible card or the CPU, so a
run's ``--device`` is checked here, in one line, before any model loads."""

from __future__ import annotations

import torch

from weightgraft.devices import device_problem
from weightgraft.training.errors import TrainingError

__all__ = ["training_device"]


def training_device(device: str | None) -> str:
    """The device a finetune runs on (``cpu``, ``cuda`` or ``mps``), or a one-line error for one
    the Trainer cannot be given here: it trains on the first visible card, so ``cuda:N`` is
    refused (``CUDA_VISIBLE_DEVICES=N`` with ``cuda`` picks card N)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda:") and device != "cuda:0" and device.partition(":")[2].isdigit():
        raise TrainingError(f"device {device!r}: a finetune trains on the first visible card; run with "
                            f"CUDA_VISIBLE_DEVICES={device.partition(':')[2]} and device 'cuda'")
    problem = device_problem(device)
    if problem is not None:
        raise TrainingError(f"device {problem}")
    return "cuda" if device.startswith("cuda") else device
