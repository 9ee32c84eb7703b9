"""The columns of a claims.csv row, typed by the step of ``grafts.py`` that computes them: its
levels (:class:`ClaimLevels`), a judged claim's threshold tests, the null tests and the gradient
estimates. The row itself (:data:`ClaimRow`) is their columns together, then the verdict's and the
run's, which later steps add."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["ClaimLevels", "ClaimRow", "Estimates", "NullTests", "ThresholdTests"]


class ClaimLevels(TypedDict):
    """A claims.csv row's statement, threshold and effects (whole, region, within, the share and its interval)."""

    claim: str
    statement: str
    setting: str
    paper_setting: str
    in_paper_setting: bool
    threshold: float
    threshold_stated: float
    threshold_note: str
    side: str  # > or <
    n_prompts: int
    n_region_keys: int
    null_kind: str
    null: str
    seed: int
    precondition: str
    whole_effect: float
    expected_sign: int
    least_p: float
    whole_ci_low: float
    whole_ci_high: float
    whole_effect_plain: float
    region_effect_plain: float
    within_effect_plain: float
    share_plain: float
    region_effect: float
    within_effect: float
    within_ci_low: float
    within_ci_high: float
    within_note: str
    share_exact: float
    ci_low: float
    ci_high: float
    ci_level: float
    interval_note: str


class ThresholdTests(TypedDict):
    """A judged claim's tests of its share against its threshold."""

    threshold_p: float
    n_past_threshold: int
    sign_p_past: float
    sign_p_short: float
    prompts_needed: float


class NullTests(TypedDict):
    """The region against each kind of its null (the larger p: an intersection-union test)."""

    null_p: float
    null_p_by_kind: str
    null_mean: float
    null_drawn: str
    n_null_unmatched: int


class Estimates(TypedDict):
    """The gradient estimates' share of the region and its ratio to the exact share."""

    share_estimate: float
    share_exact_cells: float
    interaction: float
    region_cells_share: float
    region_params_share: float


# A claims.csv row: ClaimLevels', ThresholdTests' (a judged claim's), NullTests' and Estimates' columns,
# then the verdict's (p, p_parts, p_holm, verdict, reason) and those the run adds (model, template,
# direction, evidence, note): a table's row, open to the columns later steps add
ClaimRow = dict[str, Any]
