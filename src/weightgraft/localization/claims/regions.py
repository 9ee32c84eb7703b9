"""The paper's claims about where finetuned facts are retrieved, as regions of cells and the
tests a region must pass (Nief et al., sections 4.1 and 4.3).

A claim names a *region* (the cells it says carry the effect), the cells it is a share of
(*within*), a threshold, and the *null pool* its random regions are drawn from: regions of the
region's size (and, where ``match_mix``, its count of cells per component) drawn outside it.
``claims.grafts`` grafts each region exactly and decides the verdict:

- *holds*: the region's 95% CI lies on the claim's side of the threshold and the region beats
  its null (Holm-adjusted empirical p <= ``ALPHA``);
- *fails*: the CI lies on the other side, or the region does no better than the mean random
  region of its size;
- *undecided*: otherwise (a wide CI, a region that beats the null mean but not significantly,
  or a pool too small for a null);
- *no cells*: the prompts have no cell in the region (free-form prompts without an entity span);
- *no effect*: grafting what the share is a share of (*within*) has no effect to share: the 95%
  bootstrap CI of its mean effect over prompts includes 0, so the ratio is a ratio of noise
  (whatever its value, it is no evidence for or against the claim).

The claims:

- ``fe_lt``: the first entity and the last token together carry most of the effect (> 0.5).
- ``enrichment``: the first entity's tokens carry a share (> 0, and more than random cells).
- ``recall``: the last token carries a share (> 0, and more than random cells);
  ``recall_no_unembed`` the same without the unembedding (a direct logit boost, not a recall).
- ``recall_o_late_ffn``: at the last token, O and the FFN of the last quarter (the authors'
  quarter: ``n//4`` wide, the remainder in the fourth) carry most of the last quarter's
  attention + FFN graft (> 0.5); its null: the same components at the last token in other layers.
- ``recall_not_qkv``: q/k/v of that quarter carry little of it (< 0.25, and less than random
  sets of as many of the quarter's other cells).

``paper_setting`` says where the paper made each claim: ``pre->sft`` (section 4.1: the SFT model
grafted into PRE) or ``both->a2b`` (Figure 4: a model finetuned on both directions grafted into
the model finetuned on a2b, on b2a headline prompts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from weightgraft.localization.maps import slot_parts
from weightgraft.localization.verify import CellKey

FFN = ("gate", "up", "down")
QKV = ("q", "k", "v")
ALPHA = 0.05
PRE_SFT, BOTH_A2B = "pre->sft", "both->a2b"
VERDICTS = ("holds", "fails", "undecided", "no cells", "no effect")

Predicate = Callable[[pd.DataFrame, int], pd.Series]


@dataclass(frozen=True)
class Claim:
    """``share(region) / share(within)`` compared with ``threshold`` on side ``above``, and
    with random regions drawn from ``pool`` outside the region."""

    name: str
    statement: str
    region: Predicate
    within: Predicate
    pool: Predicate
    threshold: float
    above: bool = True
    match_mix: bool = True  # null regions keep the region's count of cells per component
    paper_setting: str = PRE_SFT


def key_frame(keys: Sequence[CellKey]) -> pd.DataFrame:
    """``position_label, slot, layer, component`` of each key (the columns the regions read)."""
    parts = [slot_parts(slot) for _, slot in keys]
    frame = pd.DataFrame({"position_label": [k[0] for k in keys], "slot": [k[1] for k in keys],
                          "layer": pd.array([p[0] for p in parts], dtype="Int64"),
                          "component": [p[1] for p in parts]})
    return frame


def last_quarter(n_layers: int) -> list[int]:
    """The authors' fourth quarter: from ``3 * (n // 4)`` to the last layer (30 layers: 21-29);
    the last layer alone in a model of fewer than 4."""
    if n_layers < 4:
        return [n_layers - 1]
    from weightgraft.schemes.selectors import floor_quarter

    return floor_quarter(4, n_layers)


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


def _late(c: pd.DataFrame, n: int) -> pd.Series:
    return c["layer"].astype("float").isin(last_quarter(n))


def _lt_late_attn_ffn(c: pd.DataFrame, n: int) -> pd.Series:
    return _lt_layers(c, n) & _late(c, n) & c["component"].isin(QKV + ("o",) + FFN)


def _lt_late_o_ffn(c: pd.DataFrame, n: int) -> pd.Series:
    return _lt_late_attn_ffn(c, n) & c["component"].isin(("o",) + FFN)


def _lt_late_qkv(c: pd.DataFrame, n: int) -> pd.Series:
    return _lt_late_attn_ffn(c, n) & c["component"].isin(QKV)


CLAIMS: tuple[Claim, ...] = (
    Claim("fe_lt", "first entity + last token carry most of the effect",
          lambda c, n: _fe(c, n) | _lt(c, n), _everything, _everything, 0.5),
    Claim("enrichment", "the first entity's tokens carry a share", _fe, _everything, _everything, 0.0),
    Claim("recall", "the last token carries a share", _lt, _everything, _everything, 0.0),
    Claim("recall_no_unembed", "the last token without the unembedding carries a share",
          lambda c, n: _lt(c, n) & (c["component"] != "unembed"), _everything, _everything, 0.0),
    Claim("recall_o_late_ffn", "at the last token, O + FFN of the last quarter carry most of the quarter's "
          "attention + FFN graft", _lt_late_o_ffn, _lt_late_attn_ffn, _lt_layers, 0.5, paper_setting=BOTH_A2B),
    Claim("recall_not_qkv", "at the last token, q/k/v of the last quarter carry little of the quarter's "
          "attention + FFN graft", _lt_late_qkv, _lt_late_attn_ffn, _lt_late_attn_ffn, 0.25, above=False,
          match_mix=False, paper_setting=BOTH_A2B),
)


def empirical_p(observed: float, null: np.ndarray, above: bool) -> float:
    """``(1 + #null at least as extreme) / (1 + n)``: on the claim's side (>= for above, <= below)."""
    null = np.asarray(null, dtype=float)
    hits = int((null >= observed).sum()) if above else int((null <= observed).sum())
    return (1 + hits) / (1 + len(null))


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment (NaN entries are left out of the family and stay NaN)."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def verdict(claim: Claim, low: float, high: float, share: float, null_mean: float, p_holm: float) -> str:
    """holds / fails / undecided (see the module docstring); ``no cells`` is decided by the caller."""
    if any(np.isnan(v) for v in (low, high, share)):
        return "undecided"
    if claim.above:
        wrong_side = high <= claim.threshold or (not np.isnan(null_mean) and share <= null_mean)
        right_side = low > claim.threshold
    else:
        wrong_side = low >= claim.threshold or (not np.isnan(null_mean) and share >= null_mean)
        right_side = high < claim.threshold
    if wrong_side:
        return "fails"
    if right_side and not np.isnan(p_holm) and p_holm <= ALPHA:
        return "holds"
    return "undecided"


def mean_ci(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[float, float]:
    """Percentile bootstrap 95% CI of the mean over prompts (NaN with fewer than 2 prompts)."""
    if len(values) < 2 or n_boot < 1:
        return float("nan"), float("nan")
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Ratio of sums and its paired percentile bootstrap 95% CI over prompts."""
    share = float(num.sum() / den.sum()) if den.sum() != 0 else float("nan")
    if len(num) < 2 or n_boot < 1:
        return share, float("nan"), float("nan")
    idx = rng.integers(0, len(num), size=(n_boot, len(num)))
    d = den[idx].sum(1)
    boots = np.where(d != 0, num[idx].sum(1) / np.where(d != 0, d, 1.0), np.nan)
    low, high = np.nanpercentile(boots, [2.5, 97.5])
    return share, float(low), float(high)
