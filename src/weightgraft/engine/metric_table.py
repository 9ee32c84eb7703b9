"""Every metric a sweep records, in one table: how a row computes it, how the summary
aggregates it, whether paired differences take it, and how the report shows it.

Why: a metric touched five files (scoring, summary, pairs, report table, charts); adding one
is now one ``MetricSpec`` in ``METRIC_TABLE`` (plus its tests). The table's order is the order
of the summary's columns. Display kinds are named here and formatted by ``report.tables``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from weightgraft.experiments.prediction import (
    TOP_K,
    Prediction,
    answer_logprob,
    first_token_logprob,
    kl_divergence,
    logit_difference,
)

__all__ = ["METRIC_TABLE", "MetricSpec", "ScoreInputs", "chart_labels", "pair_skips", "paired_metrics", "row_metrics",
           "table_metrics"]


@dataclass(frozen=True)
class ScoreInputs:
    """What a row's metrics are computed from: the logits at the scored positions (row 0: the
    next token after the prompt), the answer's token ids, the scored first token's prediction,
    the distractor's first token and the donor baseline's next-token logits (None: absent)."""

    logits: torch.Tensor  # [n_logits, vocab]
    answer_ids: Sequence[int]
    prediction: Prediction
    distractor: int | None
    donor_logits: torch.Tensor | None


Aggregate = Literal["rate", "rank", "mean", "mean_ci", "ratio_of_means"]
Shown = Literal["pct_ci", "number", "mean_ci"]


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One metric. ``compute`` makes the results column ``name`` from a row's inputs (None:
    derived after scoring from other rows, as recovery is); ``recovery_of``: the log-probability column whose
    share of the SFT-PRE gap it is (``metrics.add_recovery``). ``aggregate`` names how the summary
    reduces it (None: not summarized; ``rate``: mean of hits, with a bootstrap CI where ``ci``; ``rank``: mean and
    median; ``mean``; ``mean_ci``: mean, CI and count where defined; ``ratio_of_means``: of its
    ``*_gain`` over ``*_gap`` columns, with a paired CI and a note). ``paired``: taken by paired
    differences (``pair_skip``: a boolean column whose rows they leave out). ``header`` /
    ``shown``: its column in the report's tables and how its summary value is written;
    ``chart``: summary column -> axis label, for the bar charts and heatmaps; ``flags``: a
    results column of per-row flags (``refused: ...`` / ``weak: ...``) the summary counts into
    ``<name>_note`` (``answer_tokens.logit_diff_note``)."""

    name: str
    compute: Callable[[ScoreInputs], float | bool | int] | None
    aggregate: Aggregate | None
    ci: bool = False
    paired: bool = False
    pair_skip: str | None = None
    recovery_of: str | None = None
    header: str | None = None
    shown: Shown | None = None
    chart: tuple[tuple[str, str], ...] = ()
    flags: str | None = None

    def summary_columns(self) -> list[str]:
        """The summary columns this metric writes, in order."""
        n = self.name
        if self.aggregate == "rate":
            return [n, f"{n}_lo", f"{n}_hi"] if self.ci else [n]
        if self.aggregate == "rank":
            return [f"mean_{n}", f"median_{n}"]
        if self.aggregate == "mean":
            return [f"mean_{n}"]
        if self.aggregate == "mean_ci":
            return [f"mean_{n}", f"{n}_lo", f"{n}_hi", f"n_{n}", *([f"{n}_note"] if self.flags else [])]
        if self.aggregate == "ratio_of_means":
            return [n, f"{n}_lo", f"{n}_hi", f"n_{n}", f"{n}_note"]
        return []


def _first(s: ScoreInputs) -> torch.Tensor:
    return s.logits[0]


def _finite_or_nan(fn: Callable[[ScoreInputs], float]) -> Callable[[ScoreInputs], float]:
    return lambda s: fn(s) if s.prediction.finite else float("nan")


def _top(k: int) -> MetricSpec:
    shown = {1: ("top-1 % [95% CI]", "pct_ci"), 5: ("top-5 % [95% CI]", "pct_ci")}.get(k, (None, None))
    return MetricSpec(name=f"top{k}", compute=lambda s: s.prediction.hits[k], aggregate="rate", ci=k in (1, 5),
                      paired=k in (1, 5), header=shown[0], shown=shown[1],  # type: ignore[arg-type]
                      chart=((f"top{k}", f"top-{k} accuracy (%)"),))


METRIC_TABLE: tuple[MetricSpec, ...] = (
    *(_top(k) for k in TOP_K),
    MetricSpec(name="rank", compute=lambda s: s.prediction.rank, aggregate="rank", header="mean rank", shown="number",
               chart=(("mean_rank", "mean target rank (0 = top)"), ("median_rank", "median target rank (0 = top)"))),
    MetricSpec(name="prob", compute=lambda s: s.prediction.prob, aggregate="mean"),
    MetricSpec(name="first_logprob", compute=_finite_or_nan(lambda s: first_token_logprob(_first(s), s.answer_ids[0])),
               aggregate=None),  # recovery's source
    MetricSpec(name="answer_logprob", aggregate="mean", paired=True,
               compute=_finite_or_nan(lambda s: answer_logprob(s.logits, s.answer_ids[: s.logits.shape[0]]))),
    MetricSpec(name="logit_diff", compute=lambda s: logit_difference(_first(s), s.answer_ids[0], s.distractor),
               aggregate="mean_ci", paired=True, header="logit diff vs distractor", shown="mean_ci",
               flags="logit_diff_flag"),  # NaN where refused (``scoring._distractor``)
    MetricSpec(name="kl_donor", aggregate="mean_ci", paired=True, header="KL(donor‖graft)", shown="mean_ci",
               compute=lambda s: kl_divergence(s.donor_logits, _first(s)) if s.donor_logits is not None else float("nan")),
    MetricSpec(name="recovery", compute=None, aggregate="ratio_of_means", paired=True, pair_skip="recovery_small_gap",
               recovery_of="first_logprob", header="recovery (first token)", shown="mean_ci"),
    MetricSpec(name="recovery_answer", compute=None, aggregate="ratio_of_means", recovery_of="answer_logprob",
               header="recovery (whole answer)", shown="mean_ci"),  # beside it: a weak first token misleads
)


def row_metrics(inputs: ScoreInputs) -> dict[str, float | bool | int]:
    """Every metric a row computes itself, by results column."""
    return {m.name: m.compute(inputs) for m in METRIC_TABLE if m.compute is not None}


def paired_metrics() -> tuple[str, ...]:
    """The metrics paired differences take, in the table's order."""
    return tuple(m.name for m in METRIC_TABLE if m.paired)


def pair_skips() -> dict[str, str]:
    """Metric -> the boolean column whose rows its paired differences leave out."""
    return {m.name: m.pair_skip for m in METRIC_TABLE if m.pair_skip is not None}


def table_metrics() -> tuple[MetricSpec, ...]:
    """The metrics the report's summary tables show, in column order."""
    return tuple(m for m in METRIC_TABLE if m.header is not None)


def chart_labels() -> dict[str, str]:
    """Summary column -> axis label of every metric a chart can draw."""
    return {column: label for m in METRIC_TABLE for column, label in m.chart}
