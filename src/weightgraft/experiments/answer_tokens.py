"""Whether the token an answer is scored on identifies the answer.

Rank, top-k, first-token recovery and the distractor logit difference read the answer's first
token. Where that token is short (``' T'`` of "Tilda Swinton") or begins other answers of the
dataset too, a high probability says "some name starting with T", not "Tilda Swinton": such
rows are flagged (``weak_first_token``) so that summaries and the report put the whole-answer
recovery (teacher-forced, ``recovery_answer``) beside the first-token one. A distractor logit
difference between first tokens that are prefixes of each other's names compares nothing and is
refused (NaN, with the reason in ``logit_diff_flag``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_TOKEN_CHARS = 3  # a first token shorter than this (stripped) rarely identifies a name
REFUSED = "refused: "  # ``logit_diff_flag`` prefix of a logit difference left NaN
WEAK = "weak: "  # ``logit_diff_flag`` prefix of a logit difference kept but flagged


def scored_on(first_token: str, n_scored: int, n_answer: int) -> str:
    """How a row was scored: the token rank, top-k and first-token recovery read, and how many
    of the answer's tokens ``answer_logprob`` (and whole-answer recovery) covers."""
    return f"first token {first_token!r}; answer_logprob: {n_scored} of {n_answer} tokens"


def distractor_flag(answer: str, answer_token: str, distractor: str, distractor_token: str) -> str:
    """Why the logit difference of these first tokens says nothing (``refused: ...``): the
    same token, or one's first token is a prefix of the other's name, so a logit for one is
    also a logit for (the start of) the other; ``weak: ...`` where the distractor's first token
    is under ``MIN_TOKEN_CHARS`` characters; "" when it is a comparison of two names."""
    a, d = answer_token.strip(), distractor_token.strip()
    if not a or not d:
        return f"{REFUSED}an empty first token ({answer_token!r} vs {distractor_token!r})"
    if a == d:
        return f"{REFUSED}answer and distractor share their first token {answer_token!r}"
    if distractor.strip().startswith(a):
        return f"{REFUSED}the answer's first token {answer_token!r} begins the distractor {distractor!r}"
    if answer.strip().startswith(d):
        return f"{REFUSED}the distractor's first token {distractor_token!r} begins the answer {answer!r}"
    if len(d) < MIN_TOKEN_CHARS:
        return f"{WEAK}the distractor's first token {distractor_token!r} is under {MIN_TOKEN_CHARS} characters"
    return ""


def add_answer_flags(results: pd.DataFrame) -> pd.DataFrame:
    """Per row, from every answer of the same model set (the dataset as this run scored it):
    ``first_token_shared``, how many other answers begin with the same token;
    ``weak_first_token``, that token is shared or under ``MIN_TOKEN_CHARS`` characters; and a
    kept logit difference on such a token flagged ``weak: ...`` in ``logit_diff_flag``."""
    out = results.copy()
    if out.empty or "target_token_id" not in out.columns or "answer" not in out.columns:
        return out
    answers = out[["model_set", "target_token_id", "answer"]].drop_duplicates()
    per_token = answers.groupby(["model_set", "target_token_id"])["answer"].nunique()
    idx = pd.MultiIndex.from_arrays([out["model_set"], out["target_token_id"]])
    shared = per_token.reindex(idx).to_numpy(dtype=int) - 1
    short = out["target_token"].astype(str).str.strip().str.len().to_numpy() < MIN_TOKEN_CHARS
    out["first_token_shared"] = shared
    out["weak_first_token"] = short | (shared > 0)
    flag = out["logit_diff_flag"].fillna("").astype(str) if "logit_diff_flag" in out else pd.Series("", index=out.index)
    kept = out["logit_diff"].notna().to_numpy() if "logit_diff" in out else np.zeros(len(out), dtype=bool)
    weak = kept & out["weak_first_token"].to_numpy() & (flag == "").to_numpy()
    reasons = [_weak_reason(t, n) for t, n in zip(out["target_token"].astype(str), shared, strict=True)]
    out["logit_diff_flag"] = np.where(weak, reasons, flag)
    return out


def _weak_reason(token: str, shared: int) -> str:
    parts = [f"is under {MIN_TOKEN_CHARS} characters"] if len(token.strip()) < MIN_TOKEN_CHARS else []
    if shared:
        parts.append(f"begins {shared} other answer{'s' if shared > 1 else ''}")
    return f"{WEAK}the answer's first token {token!r} " + " and ".join(parts)


def logit_diff_note(flags: pd.Series) -> str:
    """The summary's note on a group's logit differences: how many were refused, how many
    compare a first token that does not identify the answer ("" when none)."""
    flags = flags.fillna("").astype(str)
    n = len(flags)
    refused, weak = int(flags.str.startswith(REFUSED).sum()), int(flags.str.startswith(WEAK).sum())
    parts = [f"{refused} of {n} refused (first tokens that begin each other's names)"] if refused else []
    if weak:
        parts.append(f"{weak} of {n} on a first token shared with other answers or under {MIN_TOKEN_CHARS} characters")
    return "; ".join(parts)


def weak_line(n_weak: int, n: int) -> str:
    """The sentence summaries and the report print when some answers are weakly scored."""
    return (f"{n_weak} of {n} answers are scored on a first token shared with other answers or under "
            f"{MIN_TOKEN_CHARS} characters")
