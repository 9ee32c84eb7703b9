"""The claims tested by grafting each claim's whole region exactly, against a null of random
regions (``claims.csv``).

For one map (a model pair, a template, a graft direction, a setting) and every claim: the exact
effect per prompt of grafting the region, the cells it is a share of (*within*) and
``null_sets`` random regions drawn outside it (``draws``), all in one batched engine call;
``share_exact`` is the ratio of sums over prompts with its paired bootstrap CI (seeded), each
null region's share likewise, and ``null_p`` the empirical p-value of the region against them,
``null_p_holm`` Holm-adjusted over the claims of the map; ``null_critical`` is the null's 95th
percentile on the claim's side (the 5th for a "<" claim). ``share_estimate`` is the same ratio
of the summed gradient estimates of the region's cells, and ``interaction`` their ratio
(``share_exact / share_estimate``: 1 where the first-order map adds up to the region graft).
``region_cells_share`` and ``region_params_share``: the region's part of the within cells and
of their parameters, summed over prompts (what a region of no special role would carry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from weightgraft.localization.claims.regions import (CLAIMS, PRE_SFT, Claim, empirical_p, holm, key_frame, mean_ci,
                                                 ratio_ci, verdict)
from weightgraft.localization.draws import DrawError, draw_outside
from weightgraft.localization.maps import slot_parts
from weightgraft.localization.verify import CellKey

Effects = Callable[[Sequence[Sequence[CellKey]]], np.ndarray]  # sets -> [n_prompts, n_sets] exact effects


@dataclass(frozen=True)
class ClaimMap:
    """What the claims of one map need: per prompt the keys it has and their gradient
    estimates, the exact effects of key sets, the parameters of each slot, the model's depth."""

    keys: Sequence[set[CellKey]]
    estimates: Sequence[Mapping[CellKey, float]]
    effects: Effects
    params: Mapping[str, int]
    n_layers: int
    # per prompt, the exact single-cell effects where the run mapped them (``exact``): the
    # claim's share of summed exact cells, beside the estimate's and the region graft's
    exact_cells: Sequence[Mapping[CellKey, float]] = ()


def null_seed(seed: int, label: str, claim: str, index: int) -> str:
    """The seed string of one null region (distinct per map, claim and draw)."""
    return f"{seed}:{label}:{claim}:null:{index}"


def _component(key: CellKey) -> str:
    return slot_parts(key[1])[1]


def _regions(claim: Claim, pool: list[CellKey], n_layers: int) -> tuple[list[CellKey], list[CellKey], list[CellKey]]:
    frame = key_frame(pool)
    pick = lambda pred: [k for k, m in zip(pool, pred(frame, n_layers).to_numpy(bool)) if m]  # noqa: E731
    return pick(claim.region), pick(claim.within), pick(claim.pool)


def _counted(keys: Sequence[set[CellKey]], region: Sequence[CellKey], weight: Callable[[CellKey], float]) -> float:
    return float(sum(weight(k) for have in keys for k in region if k in have))


def _exact_cells_share(data: ClaimMap, region: Sequence[CellKey], within: Sequence[CellKey]) -> float:
    """The region's share of the summed exact single-cell effects, where every prompt has an
    exact effect for each of its cells of ``within`` (else NaN: a partial sum is no share)."""
    if len(data.exact_cells) != len(data.keys):
        return float("nan")
    num = den = 0.0
    for have, exact in zip(data.keys, data.exact_cells):
        keys = [k for k in within if k in have]
        if any(k not in exact for k in keys):
            return float("nan")
        den += sum(exact[k] for k in keys)
        num += sum(exact[k] for k in region if k in have)
    return num / den if den else float("nan")


def judge_claims(data: ClaimMap, label: str, setting: str = PRE_SFT, claims: Sequence[Claim] = CLAIMS,
                n_null: int = 199, seed: int = 0, n_boot: int = 2000) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rows, nulls)``: one claims.csv row per claim, and per claim the seeds and shares of
    its null regions (``label`` names the map in the seeds: model/template/direction)."""
    pool = sorted(set().union(*data.keys)) if data.keys else []
    plans = []
    for claim in claims:
        region, within, null_pool = _regions(claim, pool, data.n_layers)
        draws, how = [], "none"
        if region and n_null:
            try:
                draws = [draw_outside(null_pool, region, region, null_seed(seed, label, claim.name, j),
                                      _component if claim.match_mix else None) for j in range(n_null)]
                how = "component mix" if claim.match_mix else "uniform"
            except DrawError as exc:
                how = f"none: {exc}"
        plans.append((claim, region, within, draws, how))
    sets: dict[tuple[CellKey, ...], int] = {}
    for _, region, within, draws, _ in plans:
        for keys in [region, within] + [d.keys for d in draws]:
            sets.setdefault(tuple(sorted(keys)), len(sets))
    effects = data.effects([list(k) for k in sets]) if sets else np.zeros((len(data.keys), 0))
    rows, nulls = [], []
    for claim, region, within, draws, how in plans:
        rng = np.random.default_rng(seed)  # the same prompt resamples for every claim
        col = lambda keys: effects[:, sets[tuple(sorted(keys))]]  # noqa: E731
        row: dict[str, Any] = {"claim": claim.name, "statement": claim.statement, "setting": setting,
                               "paper_setting": claim.paper_setting, "in_paper_setting": setting == claim.paper_setting,
                               "threshold": claim.threshold, "side": ">" if claim.above else "<",
                               "n_prompts": len(data.keys), "n_region_keys": len(region), "null_drawn": how,
                               "seed": seed, "n_boot": n_boot}
        if not region:
            rows.append({**row, "within_effect": np.nan, "within_ci_low": np.nan, "within_ci_high": np.nan,
                         "share_exact": np.nan, "ci_low": np.nan, "ci_high": np.nan, "share_estimate": np.nan,
                         "share_exact_cells": np.nan, "interaction": np.nan, "region_cells_share": np.nan,
                         "region_params_share": np.nan,
                         "null_mean": np.nan, "null_critical": np.nan, "null_p": np.nan, "n_null": 0,
                         "n_null_unmatched": 0, "verdict": "no cells"})
            nulls.append({"claim": claim.name, "setting": setting, "seeds": [], "shares": []})
            continue
        num, den = col(region), col(within)
        share, low, high = ratio_ci(num, den, n_boot, rng)
        within_low, within_high = mean_ci(den, n_boot, rng)
        null_shares = np.array([col(d.keys).sum() / den.sum() if den.sum() else np.nan for d in draws])
        est_num = sum(e.get(k, 0.0) for e in data.estimates for k in region)
        est_den = sum(e.get(k, 0.0) for e in data.estimates for k in within)
        share_est = est_num / est_den if est_den else np.nan
        share_cells = _exact_cells_share(data, region, within)
        ones = _counted(data.keys, within, lambda k: 1.0)
        params = _counted(data.keys, within, lambda k: data.params.get(k[1], 0))
        rows.append({**row, "within_effect": float(den.mean()), "within_ci_low": within_low,
                     "within_ci_high": within_high, "share_exact": share, "ci_low": low, "ci_high": high,
                     "share_estimate": share_est,
                     "share_exact_cells": share_cells,
                     "interaction": share / share_est if share_est else np.nan,
                     "region_cells_share": _counted(data.keys, region, lambda k: 1.0) / ones if ones else np.nan,
                     "region_params_share": (_counted(data.keys, region, lambda k: data.params.get(k[1], 0)) / params
                                             if params else np.nan),
                     "null_mean": float(np.nanmean(null_shares)) if len(draws) else np.nan,
                     "null_critical": (float(np.nanpercentile(null_shares, 95 if claim.above else 5))
                                       if len(draws) else np.nan),
                     "null_p": empirical_p(share, null_shares, claim.above) if len(draws) else np.nan,
                     "n_null": len(draws), "n_null_unmatched": int(sum(d.n_unmatched for d in draws))})
        nulls.append({"claim": claim.name, "setting": setting, "drawn": how,
                      "seeds": [null_seed(seed, label, claim.name, j) for j in range(len(draws))],
                      "shares": [float(v) for v in null_shares], "unmatched": [d.n_unmatched for d in draws]})
    adjusted = holm([r["null_p"] for r in rows])
    for claim, r, p in zip(claims, rows, adjusted):
        r["null_p_holm"] = float(p)
        if "verdict" not in r and r["within_ci_low"] <= 0 <= r["within_ci_high"]:  # NaN (one prompt): undecided
            r["verdict"] = "no effect"
        if "verdict" not in r:
            r["verdict"] = verdict(claim, r["ci_low"], r["ci_high"], r["share_exact"], r["null_mean"],
                                   r["null_p_holm"])
    return rows, nulls
