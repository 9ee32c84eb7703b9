"""The paper's claims tested on a model pair: regions of cells and their verdicts (``regions``),
exact region grafts against a null (``grafts``), the localize stage that writes ``claims.csv``
(``stage``), and claims 4-5 in the paper's own setting (``reversal``)."""

from weightgraft.localization.claims.regions import (
    ALPHA,
    BOTH_A2B,
    CLAIMS,
    NULL_FINETUNE,
    PRE_SFT,
    RULES_VERSION,
    VERDICTS,
    Claim,
)

__all__ = ["ALPHA", "BOTH_A2B", "CLAIMS", "NULL_FINETUNE", "PRE_SFT", "RULES_VERSION", "VERDICTS", "Claim"]
