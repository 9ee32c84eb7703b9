"""Accelerator cards a plan can be made for from another machine (``--gpu h100-80gb``).

Why: planning for the cluster from a laptop is the point of ``weightgraft plan``; a CPU-only
torch cannot query a GPU, so the card's memory and rates come from this table. Memory is the
total the driver reports for the card (``nvidia-smi``'s ``memory.total``; the CUDA context takes
a few hundred MiB of it, which the plan's 90% headroom covers). Rates are the vendor's dense
peak (no sparsity) per dtype; a grafted forward reaches a share of it, ``SUSTAINED_SHARE``, a
stated assumption (not measured on the card), said in every plan that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightgraft.planning.errors import PlanError

__all__ = ["ATTRIBUTION_RATIO", "CARDS", "DISK_BYTES_PER_SECOND", "SECONDS_PER_MODULE_CALL", "SUSTAINED_SHARE", "Card",
           "card", "card_of_device"]

SUSTAINED_SHARE = 0.4  # of the dense peak, for batched matmuls of a few thousand rows
# Per grafted module call (kernel launches and the engine's row bookkeeping), which dominates at
# the paper's batch sizes: bench_paper_scale's engine times on an H200 in bfloat16
# (benchmarks/RESULTS.md: 0.9 ms/row at 1B, 1.8 ms/row at 8B, batches of 64 rows of 10-25
# tokens) leave 340 and 200 us per call after the FLOPs at SUSTAINED_SHARE; other cards assumed alike.
SECONDS_PER_MODULE_CALL = 250e-6
# Attribution (forward + backward of a partial graft) over one engine forward of the same rows:
# the backward is about two forwards; on that H200 run this predicts 0.11 s and 0.24 s for the
# measured 0.12 s (1B) and 0.17 s (8B) of attribution over 8 prompts.
ATTRIBUTION_RATIO = 3.0
# Reading the weights before the first batch: from disk at this rate (a stated assumption: a
# datacenter NVMe drive's sequential read; ``weightgraft plan --disk-gbps`` names another), then
# over the card's host link at its stated peak (PCIe x16 of the card's generation).
DISK_BYTES_PER_SECOND = 2e9


@dataclass(frozen=True)
class Card:
    """One card: memory the driver reports, the vendor's dense peak FLOP/s per dtype and its
    host link's peak; ``model`` is the word of the driver's device name that names it (``h100``
    in "NVIDIA H100 80GB HBM3")."""

    name: str
    label: str
    memory_bytes: int
    peak_flops: dict[str, float]
    model: str
    host_link_bytes_per_second: float
    disk_bytes_per_second: float = DISK_BYTES_PER_SECOND  # the disk of the machine it sits in

    def sustained_flops(self, dtype: str) -> float:
        """The rate a plan assumes for ``dtype`` on this card."""
        if dtype not in self.peak_flops:
            raise PlanError(f"card {self.name}: no stated rate for {dtype} (it has {', '.join(self.peak_flops)})")
        return SUSTAINED_SHARE * self.peak_flops[dtype]


_MIB = 2**20
_T = 1e12
_GEN5, _GEN4 = 64e9, 32e9  # PCIe x16, bytes/s each way
# float32 is plain FP32 (torch leaves TF32 off for matmuls by default); bfloat16/float16 the
# dense tensor-core rate with float32 accumulation; float64 the FP64 (tensor-core where it has one)
CARDS: dict[str, Card] = {c.name: c for c in (
    Card("h100-80gb", "NVIDIA H100 80GB SXM", 81559 * _MIB,
         {"float32": 67 * _T, "bfloat16": 989 * _T, "float16": 989 * _T, "float64": 67 * _T}, "h100", _GEN5),
    Card("h200-141gb", "NVIDIA H200 141GB SXM", 143771 * _MIB,
         {"float32": 67 * _T, "bfloat16": 989 * _T, "float16": 989 * _T, "float64": 67 * _T}, "h200", _GEN5),
    Card("a100-80gb", "NVIDIA A100 80GB SXM", 81920 * _MIB,
         {"float32": 19.5 * _T, "bfloat16": 312 * _T, "float16": 312 * _T, "float64": 19.5 * _T}, "a100", _GEN4),
    Card("a100-40gb", "NVIDIA A100 40GB SXM", 40960 * _MIB,
         {"float32": 19.5 * _T, "bfloat16": 312 * _T, "float16": 312 * _T, "float64": 19.5 * _T}, "a100", _GEN4),
    Card("l40s-48gb", "NVIDIA L40S 48GB", 46068 * _MIB,
         {"float32": 91.6 * _T, "bfloat16": 362 * _T, "float16": 362 * _T, "float64": 1.4 * _T}, "l40s", _GEN4),
    Card("rtx4090-24gb", "NVIDIA GeForce RTX 4090 24GB", 24564 * _MIB,
         {"float32": 82.6 * _T, "bfloat16": 165 * _T, "float16": 165 * _T, "float64": 1.3 * _T}, "4090", _GEN4),
)}


def card(name: str) -> Card:
    """The card named ``name`` (``h100-80gb``, ...); one line naming the known ones otherwise."""
    key = name.strip().lower()
    if key not in CARDS:
        raise PlanError(f"unknown card {name!r}; known cards: {', '.join(CARDS)}")
    return CARDS[key]


def card_of_device(device_name: str, memory_bytes: int) -> Card | None:
    """The card a CUDA device is (its driver name and total memory), or None when the table has
    no such card. Why: a grafted forward on a GPU is launch-bound at calibration sizes, so its
    FLOP rate cannot be measured on a small model; a known card's stated rate is used instead."""
    words = device_name.lower().replace("-", " ").split()
    for c in CARDS.values():
        if c.model in words and abs(memory_bytes - c.memory_bytes) <= 0.1 * c.memory_bytes:
            return c
    return None
