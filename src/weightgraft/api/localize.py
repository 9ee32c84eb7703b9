"""``weightgraft.api.localize``: the localize front door, kept at this path for the callers that
import it here; it is :func:`weightgraft.api.pipelines.localize`, where ``run``'s is too."""

from __future__ import annotations

from weightgraft.api.pipelines import localize as localize

__all__ = ["localize"]
