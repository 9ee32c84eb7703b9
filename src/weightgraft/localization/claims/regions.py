"""The paper's claims about where finetuned facts are retrieved, as regions of cells (Nief et
al., sections 4.1 and 4.3), each with the null it must beat.

A claim names a *region* (the cells it says carry the effect), the cells it is a share of
(*within*), a threshold and a side, and its null kind (``NULL_KINDS``). Its effect is in the
claims' metric (``fact_logprob`` by default: the answer's first token against the other answers of
its template among the run's prompts, ``localization/examples.py``). Its share is the region's
effect summed over prompts over within's (``grafts.py``, with its interval's level); its p is the
largest of the threshold test, the null test and, for a fact claim of a finetune in a run with a
control finetune, the test against the same region grafted from the control (``control.py``),
Holm-adjusted once over every judged row of the run (``verdicts.py``). The null kinds:

- ``positions``: the region's slots at as many other whole positions of the prompt (random sets of
  the same token count, the same layers and components), drawn per prompt from the positions no
  claim names (``null_avoid``: the first entity's claim is not compared with the last token, which
  the recall claims name, nor recall with the first entity);
- ``complement``: the rest of *within* (a region too large for random positions: FE+LT covers
  most of a short prompt's positions);
- ``layer blocks``: the region's components at the same positions in every other contiguous block
  of layers of the region's size, and ``other components``: as many other components at the
  region's own layers; a component claim must beat both;
- a *marginal* claim's region effect is ``within - (within minus region)`` (what the region adds
  given the rest), and its null the marginal of as many other components of *within*.

The claims:

- ``fe_lt``: the first entity and the last token together carry most of the effect (> 0.5).
- ``enrichment``: the first entity's tokens carry a share (> 0, and more than random positions).
- ``recall``: the last token carries a share (> 0, and more than random positions);
  ``recall_no_unembed`` the same without the unembedding (a direct logit boost, not a recall).
- ``recall_o_late_ffn``: at the last token, O and the FFN of the last quarter (the authors'
  quarter: ``n//4`` wide, the remainder in the fourth) carry most of the quarter's attention + O +
  FFN graft (> 0.5, or > their share of its parameters where larger: ``grafts.even_spread_threshold``;
  the share is the region's cells' parameters over within's, summed over prompts).
- ``qkv_marginal``: given O + FFN there, q/k/v add little (< 0.25, or < their parameter share where
  smaller): the paper's "grafting the O
  matrix and the full FFN nearly recovers the results of grafting the full attention mechanism
  and the full FFN" (section 4.3), the marginal ATTN+O+FFN minus O+FFN.
- ``attn_ffn_no_o`` (shown, not judged): the authors' ATTN+FFN row, the quarter's graft without O.

``paper_setting`` says where the paper made each claim: ``pre->sft`` (section 4.1: the SFT model
grafted into PRE) or ``both->a2b`` (Figure 4: a model finetuned on both directions grafted into
the model finetuned on a2b, on b2a headline prompts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import pandas as pd

from weightgraft.localization.maps import slot_parts
from weightgraft.localization.verify import CellKey
from weightgraft.schemes.selectors import floor_quarter

FFN = ("gate", "up", "down")
QKV = ("q", "k", "v")
ALPHA = 0.05
# The version of the claims' rules and metric: the verdicts, thresholds, intervals and nulls of this
# package and the effect they are judged in. Raise it with any change that can move a row of
# claims.csv; every generated block of the docs records the version it was made with, and
# tests/project/test_docs_blocks.py fails on a block made with an older one. 7: the fact-specific
# metric, one p per row with the control part, thresholds at the parameter share; 8: each row
# records its interval's level (ci_level); 9: the share's interval held at 95% on every design of
# docs/statistics.md (Fieller's bounds at 99.99999%) and the threshold p that inverts it.
RULES_VERSION = 9
PRE_SFT, BOTH_A2B, NULL_FINETUNE = "pre->sft", "both->a2b", "null finetune"
VERDICTS = ("holds", "fails", "undecided", "no cells", "no effect", "precondition not met", "shown")
NullKind = Literal["positions", "complement", "components", "none"]
NULL_KINDS: dict[str, str] = {
    "positions": "random whole positions of the same token count (same slots), among the positions no claim names",
    "complement": "the rest of within",
    "components": "other layer blocks of the same size; other components at the same layers",
    "none": "none (shown, not judged)",
}

Predicate = Callable[[pd.DataFrame, int], pd.Series]


@dataclass(frozen=True)
class Claim:
    """``effect(region) / effect(within)`` against ``threshold`` on side ``above``, and the
    region against its ``null`` across prompts. ``marginal``: the region's effect is what it adds
    to the rest of within."""

    name: str
    statement: str
    region: Predicate
    within: Predicate
    threshold: float
    null: NullKind
    above: bool = True
    marginal: bool = False
    paper_setting: str = PRE_SFT
    null_avoid: Predicate | None = None  # positions a position null never draws (another claim's region)

    @property
    def judged(self) -> bool:
        return self.null != "none"


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

    return floor_quarter(4, n_layers)


def _fe(c: pd.DataFrame, n: int) -> pd.Series:
    """The first entity's own tokens (``first_entity_last``, ``first_entity_last-k``), not the
    words after it (``first_entity_last+k``)."""
    return c["position_label"].str.fullmatch(r"first_entity_last(-\d+)?(#\d+)?")


def _lt(c: pd.DataFrame, n: int) -> pd.Series:
    return c["position_label"] == "last"


def _everything(c: pd.DataFrame, n: int) -> pd.Series:
    return pd.Series(True, index=c.index)


def _lt_late(c: pd.DataFrame, n: int, components: Sequence[str]) -> pd.Series:
    late = c["layer"].astype("float").isin(last_quarter(n))
    return _lt(c, n) & c["layer"].notna() & late & c["component"].isin(components)


def _lt_late_attn_o_ffn(c: pd.DataFrame, n: int) -> pd.Series:
    return _lt_late(c, n, QKV + ("o",) + FFN)


CLAIMS: tuple[Claim, ...] = (
    Claim("fe_lt", "first entity + last token carry most of the effect",
          lambda c, n: _fe(c, n) | _lt(c, n), _everything, 0.5, "complement"),
    Claim("enrichment", "the first entity's tokens carry a share", _fe, _everything, 0.0, "positions", null_avoid=_lt),
    Claim("recall", "the last token carries a share", _lt, _everything, 0.0, "positions", null_avoid=_fe),
    Claim("recall_no_unembed", "the last token without the unembedding carries a share",
          lambda c, n: _lt(c, n) & (c["component"] != "unembed"), _everything, 0.0, "positions", null_avoid=_fe),
    Claim("recall_o_late_ffn", "at the last token, O + FFN of the last quarter carry most of the quarter's "
          "attention + O + FFN graft", lambda c, n: _lt_late(c, n, ("o",) + FFN), _lt_late_attn_o_ffn, 0.5,
          "components", paper_setting=BOTH_A2B),
    Claim("qkv_marginal", "at the last token, q/k/v of the last quarter add little to its O + FFN (the marginal "
          "of q/k/v: attention + O + FFN minus O + FFN)", lambda c, n: _lt_late(c, n, QKV), _lt_late_attn_o_ffn,
          0.25, "components", above=False, marginal=True, paper_setting=BOTH_A2B),
    Claim("attn_ffn_no_o", "at the last token, the last quarter's attention + FFN without O (the authors' "
          "ATTN+FFN row)", lambda c, n: _lt_late(c, n, QKV + FFN), _lt_late_attn_o_ffn, float("nan"), "none",
          paper_setting=BOTH_A2B),
)
