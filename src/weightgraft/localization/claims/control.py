"""The control finetune's test: a fact claim of an SFT model must beat the same region grafted
from the control donor (the same recipe and texts with the answers shuffled among the subjects:
it learns the format and the answer words, no fact), prompt by prompt.

Per prompt the SFT's region effect minus the control's on the same prompt (same template,
direction and claim); the one-sided paired sign-flip test across prompts (``stats.paired_p``
with the control's effect as a null of one draw), valid where under the null the two donors'
effects are exchangeable on each prompt. Its p is one part of the row's p (``verdicts``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from weightgraft.localization.claims.regions import PRE_SFT
from weightgraft.stats import paired_p

FACT_CLAIMS = ("fe_lt", "enrichment", "recall", "recall_no_unembed")
KEYS = ["template", "direction", "claim"]


def against_control(table: pd.DataFrame, prompts: pd.DataFrame, *, control: str, seed: int,
                    n_resamples: int) -> pd.DataFrame:
    """``table`` with ``control_p``, ``control_region_effect`` (the control's mean region effect
    on the same prompts) and ``n_control_prompts`` on each fact claim's row of an SFT model in
    the pre->sft setting; NaN / 0 elsewhere, and where the control has no such map (the row's
    ``control_note`` says why)."""
    out = table.copy()
    out["control_p"], out["control_region_effect"], out["n_control_prompts"] = np.nan, np.nan, 0
    out["control_note"] = ""
    theirs = prompts[prompts["model"] == control]
    for idx, row in out.iterrows():
        if row["claim"] not in FACT_CLAIMS or row["model"] == control or row["setting"] != PRE_SFT:
            continue
        where = {k: row[k] for k in KEYS}
        mine = prompts[(prompts["model"] == row["model"]) & (prompts["setting"] == row["setting"])
                       & (prompts[KEYS] == pd.Series(where)).all(axis=1)]
        other = theirs[(theirs[KEYS] == pd.Series(where)).all(axis=1)]
        joined = mine.merge(other[["prompt_id", "region_effect"]], on="prompt_id", suffixes=("", "_control"))
        if joined.empty:
            out.at[idx, "control_note"] = f"the control {control!r} has no map of these prompts"
            continue
        out.at[idx, "control_p"] = paired_p(joined["region_effect"].to_numpy(float),
                                            joined["region_effect_control"].to_numpy(float),
                                            alternative="greater" if row.get("expected_sign", 1) > 0 else "less",
                                            seed=seed, n_resamples=n_resamples)
        out.at[idx, "control_region_effect"] = float(joined["region_effect_control"].mean())
        out.at[idx, "n_control_prompts"] = len(joined)
        if len(joined) < len(mine):
            out.at[idx, "control_note"] = f"{len(mine) - len(joined)} prompt(s) without the control's effect"
    return out
