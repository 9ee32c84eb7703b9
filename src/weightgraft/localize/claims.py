"""The paper's claims about where finetuned facts are retrieved, stated as tests on a cell map.

Each claim compares a share of the summed single-cell effects of a prompt (the map's
first-order decomposition of the graft: interactions between cells are not in it) with a
threshold. Shares are ratios of sums over prompts, ``sum_p E_p(region) / sum_p E_p(whole)``, so
that prompts with a small total do not dominate, with a paired bootstrap CI over prompts
(seeded). A claim *holds* where the whole CI lies on its side of the threshold, *fails* where
it lies on the other side, and is *undecided* otherwise; a claim whose region has no cells in the
map (prompts without a first entity span) says *no cells*, never *fails*.

The claims (Nief et al., sections 4.1 and 4.3):

- ``fe_lt``: the first entity and the last token together carry most of the effect (> 0.5).
- ``enrichment``: the first entity's tokens alone carry a positive share (> 0).
- ``recall``: the last token alone carries a positive share (> 0).
- ``recall_o_late_ffn``: of the last token's layer cells, O and the FFN of the last quarter of
  layers carry most (> 0.5).
- ``recall_not_qkv``: of the last token's layer cells, q/k/v carry little (< 0.25).

``claims_table`` writes them for a localize run (``claims.csv``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from weightgraft.localize.maps import whole_cells

FFN = ("gate", "up", "down")
QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Claim:
    """``share(region) / share(within)`` compared with ``threshold`` on side ``above``."""

    name: str
    statement: str
    region: Callable[[pd.DataFrame, int], pd.Series]
    within: Callable[[pd.DataFrame, int], pd.Series]
    threshold: float
    above: bool = True


def _fe(c: pd.DataFrame, n: int) -> pd.Series:
    """The first entity's own tokens (``first_entity``, ``first_entity-k``), not the words
    after it (``first_entity+k``)."""
    return c["position_label"].str.fullmatch(r"first_entity(-\d+)?(#\d+)?")


def _lt(c: pd.DataFrame, n: int) -> pd.Series:
    return c["position_label"] == "last"


def _everything(c: pd.DataFrame, n: int) -> pd.Series:
    return pd.Series(True, index=c.index)


def _lt_layers(c: pd.DataFrame, n: int) -> pd.Series:
    return _lt(c, n) & c["layer"].notna()


def _late_quarter(c: pd.DataFrame, n: int) -> pd.Series:
    return c["layer"].astype("float").fillna(-1) >= n - max(n // 4, 1)


CLAIMS: tuple[Claim, ...] = (
    Claim("fe_lt", "first entity + last token carry most of the effect", lambda c, n: _fe(c, n) | _lt(c, n),
          _everything, 0.5),
    Claim("enrichment", "the first entity's tokens carry a positive share", _fe, _everything, 0.0),
    Claim("recall", "the last token carries a positive share", _lt, _everything, 0.0),
    Claim("recall_o_late_ffn", "at the last token, O and the last quarter's FFN carry most of the layer cells' effect",
          lambda c, n: _lt_layers(c, n) & (c["component"].eq("o") | (c["component"].isin(FFN) & _late_quarter(c, n))),
          _lt_layers, 0.5),
    Claim("recall_not_qkv", "at the last token, q/k/v carry little of the layer cells' effect",
          lambda c, n: _lt_layers(c, n) & c["component"].isin(QKV), _lt_layers, 0.25, above=False),
)


def _ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Ratio of sums and its paired percentile bootstrap 95% CI over prompts."""
    share = float(num.sum() / den.sum()) if den.sum() != 0 else float("nan")
    if len(num) < 2 or n_boot < 1:
        return share, float("nan"), float("nan")
    idx = rng.integers(0, len(num), size=(n_boot, len(num)))
    d = den[idx].sum(1)
    boots = np.where(d != 0, num[idx].sum(1) / np.where(d != 0, d, 1.0), np.nan)
    low, high = np.nanpercentile(boots, [2.5, 97.5])
    return share, float(low), float(high)


def _verdict(claim: Claim, low: float, high: float) -> str:
    if np.isnan(low) or np.isnan(high):
        return "undecided"
    if claim.above:
        return "holds" if low > claim.threshold else ("fails" if high <= claim.threshold else "undecided")
    return "holds" if high < claim.threshold else ("fails" if low >= claim.threshold else "undecided")


def check_claims(cells: pd.DataFrame, n_layers: int | None = None, column: str = "estimate",
                 n_boot: int = 2000, seed: int = 0, by: tuple[str, ...] | None = None) -> pd.DataFrame:
    """One row per claim and group of ``by`` (default: SFT model where the map has several,
    template, direction): the share, its CI, the verdict, and how many prompts and cells it
    rests on. ``column`` is the effect used (``exact`` or ``estimate``); prompts without a value
    in it are left out and counted (``n_prompts_without``). Whole cells only (unit cells of a
    ``units:`` run would count their slot twice). ``n_layers`` defaults to the map's."""
    if column not in cells:
        raise ValueError(f"the cell map has no column {column!r} (it has {', '.join(map(str, cells.columns))})")
    frame = whole_cells(cells)
    if n_layers is None:
        n_layers = int(frame["layer"].max()) + 1
    if by is None:
        by = (("model",) if "model" in frame else ()) + ("template", "direction")
    rows = []
    for key, group in frame.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        has = group.groupby("example_id")[column].apply(lambda s: bool(s.notna().all()))
        kept = group[group["example_id"].isin(has[has].index)]
        values = kept[column].fillna(0.0)
        for claim in CLAIMS:
            rng = np.random.default_rng(seed)  # the same prompt resamples for every claim
            region = claim.region(kept, n_layers)
            within = claim.within(kept, n_layers)
            num = values.where(region, 0.0).groupby(kept["example_id"]).sum()
            den = values.where(within, 0.0).groupby(kept["example_id"]).sum().reindex(num.index)
            share, low, high = _ratio_ci(num.to_numpy(float), den.to_numpy(float), n_boot, rng)
            verdict = _verdict(claim, low, high)
            if not bool(region.any()):  # e.g. free-form prompts without a first entity span
                share = low = high = float("nan")
                verdict = "no cells"
            rows.append({**dict(zip(by, key)), "claim": claim.name, "statement": claim.statement,
                         "share": share, "ci_low": low, "ci_high": high,
                         "threshold": claim.threshold, "side": ">" if claim.above else "<",
                         "verdict": verdict, "effect": column,
                         "n_prompts": int(len(num)), "n_prompts_without": int((~has).sum()),
                         "n_cells": int(region.sum())})
    return pd.DataFrame(rows)


def claims_table(cells: pd.DataFrame, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """``claims.csv`` of a localize run: the claims on the gradient estimates of every prompt,
    and on the exact effects of the prompts that have an exact map (``effect`` says which)."""
    frames = [check_claims(cells, column="estimate", n_boot=n_boot, seed=seed)]
    if "exact" in cells and whole_cells(cells)["exact"].notna().any():
        exact = check_claims(cells, column="exact", n_boot=n_boot, seed=seed)
        frames.append(exact[exact["n_prompts"] > 0])
    return pd.concat(frames, ignore_index=True)
