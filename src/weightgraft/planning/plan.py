"""A plan: what a run will need (memory by part, batch size, time) against what it may reach,
and the one-line refusal of a plan that does not fit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.planning.errors import PlanError
from weightgraft.planning.lengths import PromptLengths
from weightgraft.planning.sizes import gib
from weightgraft.resume.manifests import Json

__all__ = ["HEADROOM", "UNREADABLE_CONFIG", "Plan", "RolePlan", "check_plan", "choose_batch", "smaller_batch"]

HEADROOM = 0.9  # a chosen batch size keeps the predicted peak under this share of the budget
# What a plan raises where it cannot read a model's config (a hub id not in the cache, a broken
# directory): ``run`` and ``localize`` then go on without the plan's batch size, and the loader
# says what is wrong in its own words. Every other error, the user's and a bug alike, is raised.
UNREADABLE_CONFIG = (ModelLoadError, ModelNotFoundError, OSError)

MemoryAt = Callable[[int], dict[str, int]]  # batch size -> the parts of the peak


@dataclass(frozen=True, kw_only=True)
class RolePlan:
    """One model role: where its config came from and what it holds."""

    model_set: str
    role: str
    spec: str
    config: str
    n_params: int
    held_bytes: int
    holds: str  # "whole", "lean (N of M slots)", "LoRA adapter", ...
    read_bytes: int | None = None  # bytes read and copied to load it, where not ``held_bytes`` (quantized on load)

    @property
    def loaded_bytes(self) -> int:
        """What loading it reads from disk and copies to the device."""
        return self.held_bytes if self.read_bytes is None else self.read_bytes


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a run will need; ``as_dict`` is ``weightgraft plan --json``. ``suggestions`` are
    changes the plan's own arithmetic says fit; ``least`` says, when none does, the least this
    config can need and with what."""

    kind: Literal["run", "localize"]
    device: str
    dtype: str
    roles: list[RolePlan]
    prompts: PromptLengths  # n, min/max/mean tokens, how they were counted
    rows: int  # (example, scheme) rows (localize: examples)
    batch_size: int
    batch_size_fixed: bool
    batches: int
    memory: dict[str, int]  # the parts of the peak
    budget_bytes: int
    budget_source: str
    predicted_seconds: float | None
    time_parts: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    least: str | None = None

    @property
    def peak_bytes(self) -> int:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes

    def as_dict(self) -> Json:
        out = asdict(self)
        out["peak_bytes"], out["fits"] = self.peak_bytes, self.fits
        return out

    def refusal(self) -> str:
        """The one-line refusal of a run that does not fit."""
        what = f"batch size {self.batch_size}" if self.batch_size_fixed else "a batch of one"
        if self.suggestions:
            fix = "it would fit with: " + "; ".join(self.suggestions)
        else:
            fix = "nothing in this config fits here" + (f": {self.least}" if self.least else "")
        return (f"this {self.kind} needs {gib(self.peak_bytes)} at {what} ({self._parts()}) but "
                f"{gib(self.budget_bytes)} are available ({self.budget_source}); {fix}")

    def _parts(self) -> str:
        return ", ".join(f"{k} {gib(v)}" for k, v in self.memory.items() if v >= 2**24)


def choose_batch(fixed: int | None, default: int, n_rows: int, memory_at: MemoryAt, limit: float) -> int:
    """The config's batch size, else the largest (up to ``default``) whose peak fits ``limit``."""
    if fixed is not None:
        return fixed
    best = 1
    limit = max(limit, sum(memory_at(1).values()))  # a larger batch that costs nothing more is taken
    for b in range(1, min(default, max(1, n_rows)) + 1):
        if sum(memory_at(b).values()) <= limit:
            best = b
        else:
            break
    return best


def smaller_batch(fixed: int, memory_at: MemoryAt, limit: int) -> int | None:
    """The largest batch below ``fixed`` whose peak fits ``limit`` (None: not even one)."""
    b = choose_batch(None, fixed, fixed, memory_at, limit)
    return b if sum(memory_at(b).values()) <= limit else None


def check_plan(plan: Plan) -> Plan:
    """Raise :class:`PlanError` (one line) when the plan does not fit; else return it."""
    if not plan.fits:
        raise PlanError(plan.refusal())
    return plan
