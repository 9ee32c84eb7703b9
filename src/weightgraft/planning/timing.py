"""Predicted wall time: FLOPs of every batch over a rate, either this device's measured rate
(``weightgraft.planning.calibration``) or a named card's stated rate (``planning.cards``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from weightgraft.engine.cells import OUTPUT_ONLY
from weightgraft.models.footprint import ModelFootprint
from weightgraft.planning.calibration import Throughput, module_calls
from weightgraft.planning.cards import (
    ATTRIBUTION_RATIO,
    CARDS,
    SECONDS_PER_MODULE_CALL,
    SUSTAINED_SHARE,
    Card,
    card_of_device,
)
from weightgraft.planning.costs import forward_flops

__all__ = ["attribution_seconds", "card_for", "exact_cell_seconds", "forward_seconds", "rate_for", "weight_read_seconds"]


def card_for(device: str, gpu: Card | None) -> tuple[Card | None, str | None]:
    """The card a plan is for: the one named, or the card this CUDA device is; None with the
    reason when a CUDA device is absent here or not in the table; None without one for a CPU."""
    if gpu is not None or not device.startswith("cuda"):
        return gpu, None
    from weightgraft.planning.budget import cuda_here

    if not cuda_here():
        return None, "time not predicted: no CUDA device here to measure; name the card with --gpu"
    name, total = _cuda_device(device)
    found = card_of_device(name, total)
    if found is None:
        return None, (f"time not predicted: {name} is not in the card table ({', '.join(CARDS)}); "
                      "name the nearest with --gpu")
    return found, None


def rate_for(device: str, dtype: str, gpu: Card | None) -> tuple[Throughput | None, str | None]:
    """The rate to predict time with, and a note on where it comes from. A named card, or the
    card this CUDA device is: its stated rate; a CUDA config where this torch has no CUDA: none
    (time not predicted); an unknown GPU: none either (a small model's measured rate on a GPU is
    launch-bound, hundreds of times too slow); a CPU: its measured rate (measured once, cached)."""
    gpu, missing = card_for(device, gpu)
    if missing is not None:
        return None, missing
    if gpu is not None:
        rate = Throughput(f"card {gpu.name}|{dtype}", gpu.sustained_flops(dtype), SECONDS_PER_MODULE_CALL,
                          ATTRIBUTION_RATIO, "stated")
        note = (f"time from the stated rates of {gpu.label}: {SUSTAINED_SHARE:.0%} of its dense {dtype} peak "
                f"({gpu.peak_flops[dtype] / 1e12:g} TFLOP/s), {SECONDS_PER_MODULE_CALL * 1e6:g} us per grafted "
                f"module call, attribution {ATTRIBUTION_RATIO:g}x a forward; not measured on the card")
        return rate, note
    from weightgraft.planning.calibration import throughput

    rate = throughput(device, dtype)
    if rate.busy:
        return rate, (f"this CPU's rates were measured while other work loaded it ({rate.busy}): times may be several "
                      "times too long; they are not kept, so a plan on an idle machine measures again")
    return rate, None


def weight_read_seconds(loaded_bytes: Sequence[int], gpu: Card) -> tuple[dict[str, float], str]:
    """Reading every model before the first batch (``RolePlan.loaded_bytes``: what it holds, or
    for a role quantized as it loads its dense weights: transformers reads them and copies them to
    the card before it quantizes them there): from disk, then over the card's host link, one
    after the other (a stated upper bound: loaders overlap the two in part); and the note that
    states both rates."""
    total = sum(loaded_bytes)
    parts = {"read weights from disk": total / gpu.disk_bytes_per_second,
             "copy weights to the card": total / gpu.host_link_bytes_per_second}
    note = (f"reading the weights ({total / 2**30:.2f} GiB read): disk at {gpu.disk_bytes_per_second / 1e9:g} GB/s "
            f"(assumed; --disk-gbps names yours), then the card's host link at its stated "
            f"{gpu.host_link_bytes_per_second / 1e9:g} GB/s")
    return parts, note


def _cuda_device(device: str) -> tuple[str, int]:
    import torch

    where = torch.device(device)
    return torch.cuda.get_device_name(where), int(torch.cuda.get_device_properties(where).total_memory)


def forward_seconds(base: ModelFootprint, rows: Sequence[tuple[int, int]], batch: int, rate: Throughput) -> float:
    """Grafted forward passes over ``rows`` ((tokens, logits) per row) in batches of ``batch``."""
    calls = module_calls(base)
    total = 0.0
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        seq = max(t for t, _ in chunk)
        total += rate.batch_seconds(forward_flops(base, len(chunk) * seq, seq, sum(n for _, n in chunk)), calls)
    return total


def attribution_seconds(pre: ModelFootprint, lengths: Sequence[int], batch: int, rate: Throughput) -> float:
    """One graft attribution (forward + backward) over prompts of ``lengths`` tokens, batched
    by length as localize batches them (sorted: little padding)."""
    calls = module_calls(pre)
    order = sorted(lengths)
    total = 0.0
    for i in range(0, len(order), batch):
        chunk = order[i : i + batch]
        flops = forward_flops(pre, len(chunk) * max(chunk), max(chunk), len(chunk))
        total += rate.attribution_ratio * rate.batch_seconds(flops, calls)
    return total


def exact_cell_seconds(pre: ModelFootprint, lengths: Sequence[int], chunk: int, rate: Throughput) -> float:
    """Exact single-cell effects of every cell of prompts of ``lengths`` tokens, one direction:
    with prefix sharing a cell at position p recomputes positions p..t-1 only; cells run
    ``chunk`` at a time."""
    out_only = len(OUTPUT_ONLY)  # final_norm, unembed: a cell at the scored position only
    per_position = len(pre.slot_names) - out_only
    tokens = sum(sum((t - p) * per_position for p in range(t)) + out_only for t in lengths)
    cells = sum(t * per_position + out_only for t in lengths)
    flops = forward_flops(pre, tokens, max(lengths), cells)
    return rate.batch_seconds(flops, module_calls(pre) * math.ceil(cells / chunk))
