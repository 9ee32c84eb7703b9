"""Paired differences between two schemes on the same examples, with their intervals.

Schemes of a sweep share their examples, so "does FE+LT beat LT?" is best read from the
per-example differences (which cancel the examples' own difficulty) rather than from two
separate means and their intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, model_validator

from weightgraft.engine.metric_table import pair_skips, paired_metrics
from weightgraft.stats import mean_ci


class SchemePair(BaseModel):
    """Scheme ``a`` minus scheme ``b``; a config may write ``{a: FE+LT, b: LT}`` or
    ``[FE+LT, LT]``."""

    model_config = ConfigDict(extra="forbid")

    a: str
    b: str

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            if len(value) != 2:
                raise ValueError(f"a pair names two schemes, got {list(value)}")
            return {"a": value[0], "b": value[1]}
        return value


def check_pairs(pairs: Sequence[SchemePair], scheme_names: Sequence[str]) -> None:
    """Every paired scheme is in the sweep (before any model loads)."""
    known = set(scheme_names)
    for i, pair in enumerate(pairs):
        for name in (pair.a, pair.b):
            if name not in known:
                raise ValueError(f"pairs.{i}: scheme {name!r} is not in the sweep (it has {sorted(known)})")


def paired_differences(
    results: pd.DataFrame, pairs: Sequence[SchemePair], metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per (model set, template, pair, metric): the mean of ``a - b`` over the examples
    both schemes scored (finite logits, metric defined), with the 95% t interval of the paired
    differences (``weightgraft.stats.mean_ci``: NaN bounds where it declines).
    ``metrics``: default every metric the metric table marks as paired."""
    metrics = paired_metrics() if metrics is None else metrics
    skips = pair_skips()
    rows = []
    ok = results[results["finite"]] if "finite" in results.columns else results
    for (model_set, template), group in ok.groupby(["model_set", "template"], sort=False):
        by_scheme = {s: g.set_index("example_id") for s, g in group.groupby("scheme", sort=False)}
        for pair in pairs:
            if pair.a not in by_scheme or pair.b not in by_scheme:
                continue
            a, b = by_scheme[pair.a], by_scheme[pair.b]
            common = a.index.intersection(b.index)
            for name in metrics:
                if name not in a.columns:
                    continue
                va = a.loc[common, name].to_numpy(dtype=float)
                vb = b.loc[common, name].to_numpy(dtype=float)
                skip = skips.get(name)
                if skip is not None and skip in a.columns:
                    keep = ~a.loc[common, skip].fillna(False).astype(bool).to_numpy()
                    va, vb = va[keep], vb[keep]
                both = np.isfinite(va - vb)
                va, vb = va[both], vb[both]
                diff = va - vb
                _, lo, hi = mean_ci(diff) if diff.size else (np.nan, np.nan, np.nan)
                rows.append({
                    "model_set": model_set, "template": template, "a": pair.a, "b": pair.b,
                    "metric": name, "n": int(diff.size),
                    "mean_a": float(va.mean()) if va.size else float("nan"),
                    "mean_b": float(vb.mean()) if vb.size else float("nan"),
                    "mean_diff": float(diff.mean()) if diff.size else float("nan"), "lo": lo, "hi": hi,
                })
    return pd.DataFrame(rows)
