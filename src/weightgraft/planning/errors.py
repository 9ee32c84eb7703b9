"""The one error a plan raises: a run that cannot fit, or a plan asked of what it cannot read."""

from __future__ import annotations

from weightgraft.errors import WeightgraftError

__all__ = ["PlanError"]


class PlanError(WeightgraftError, ValueError):
    """A run whose plan cannot fit (one line, with what would make it fit, or that nothing
    would), or a plan request that cannot be answered here (a size, a card, a device)."""
