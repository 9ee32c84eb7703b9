"""The metric vocabulary: every metric by one name, with one sign and one implementation.

Why: a metric touched five files (scoring, summary, pairs, report table, charts), and the same
word meant two quantities (``kl`` was KL(donor || grafted) in a sweep's rows and -KL in
localize). Each entry here is a ``MetricSpec``: its name, what it means and which way is
better, its one implementation, how a sweep's summary aggregates it, whether paired
differences take it, and how the report's tables, console and figures show it. A sweep's rows,
its summary and pairs, localize (the entries with a ``batch`` form) and the report read this
table and nothing else; adding a metric is one entry. The table's order is the summary's.

It sits on the engine's floor because attribution differentiates the ``batch`` forms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from weightgraft.errors import GraftArgumentError

__all__ = ["LEGACY_NAMES", "METRIC_TABLE", "Batch", "Chart", "MetricSpec", "Prediction", "ScoreInputs", "TOP_K",
           "chart_labels", "chart_of", "console_metrics", "describe", "figure_defaults", "kl_donor", "localize_metric",
           "localize_metrics", "logit_diff", "fact_logprob", "first_logprob", "pair_skips", "paired_metrics", "row_metrics",
           "score_next_token", "spec", "table_metrics"]

TOP_K: tuple[int, ...] = (1, 5, 10, 20, 50, 100)
N_TOP_TOKENS = 20


# ---------------------------------------------------------------- the one implementation of each quantity

@dataclass(frozen=True)
class Batch:
    """Logits ``[batch, vocab]`` at the scored positions, the target (the answer's first token)
    per row, the tokens the answer is contrasted with (or None): ``[batch]`` one distractor's
    first token, or ``[batch, k]`` a set of first tokens padded with -1 (``fact_logprob``: the
    world's other answers), and the donor's next-token log-probabilities ``[batch, vocab]`` (or
    None). Values come out in the logits' dtype."""

    logits: torch.Tensor
    targets: torch.Tensor
    distractors: torch.Tensor | None = None
    reference: torch.Tensor | None = None

    def rows(self) -> torch.Tensor:
        return torch.arange(self.logits.shape[0], device=self.logits.device)


def first_logprob(b: Batch) -> torch.Tensor:
    """log p(answer's first token): higher means the answer is more likely."""
    return torch.log_softmax(b.logits, dim=-1)[b.rows(), b.targets.to(b.logits.device)]


def logit_diff(b: Batch) -> torch.Tensor:
    """logit[answer] - logit[distractor] (first tokens): higher means the answer is preferred."""
    if b.distractors is None:
        raise GraftArgumentError("metric 'logit_diff' needs a distractor token per row")
    rows = b.rows()
    return b.logits[rows, b.targets.to(b.logits.device)] - b.logits[rows, b.distractors.to(b.logits.device)]


def fact_logprob(b: Batch) -> torch.Tensor:
    """log p(answer's first token) minus the mean log p of the first tokens of the world's other
    answers (``distractors [batch, k]``, padded with -1), on the same pass: what is specific to
    this subject's answer. A donor that raises every answer of the world alike moves it by 0. The
    softmax's normalizer cancels, so it is computed as logit[answer] - mean logit[other answers]."""
    if b.distractors is None or b.distractors.dim() != 2:
        raise GraftArgumentError("metric 'fact_logprob' needs the world's other answers' first tokens per row")
    rows = b.rows()
    others = b.distractors.to(b.logits.device)
    valid = others.ge(0)
    if not bool(valid.any(dim=1).all()):
        raise GraftArgumentError("metric 'fact_logprob' needs at least one other answer per row")
    picked = b.logits.gather(1, others.clamp(min=0))
    mean = (picked * valid).sum(1) / valid.sum(1)
    return b.logits[rows, b.targets.to(b.logits.device)] - mean


def kl_donor(b: Batch) -> torch.Tensor:
    """KL(donor || grafted) in nats, >= 0: 0 is the donor's own distribution, lower is closer."""
    if b.reference is None:
        raise GraftArgumentError("metric 'kl_donor' needs the donor's next-token log-probabilities")
    ref = b.reference.to(device=b.logits.device, dtype=b.logits.dtype)
    return (ref.exp() * (ref - torch.log_softmax(b.logits, dim=-1))).sum(-1)


@dataclass(frozen=True)
class Prediction:
    """Metrics of the next-token distribution at the last prompt token."""

    target_token_id: int
    rank: int  # 0-based: how many tokens are strictly more probable than the target
    prob: float
    hits: dict[int, bool]
    top_ids: list[int]
    top_probs: list[float]
    finite: bool


def score_next_token(logits: torch.Tensor, target: int) -> Prediction:
    """Rank, probability and top-k hits of ``target`` under ``logits`` ([vocab])."""
    logits = logits.float()
    finite = bool(torch.isfinite(logits).all())
    if not finite:
        return Prediction(target, -1, float("nan"), {k: False for k in TOP_K}, [], [], False)
    probs = torch.softmax(logits, dim=-1)
    rank = int((logits > logits[target]).sum())
    top = torch.topk(probs, k=min(N_TOP_TOKENS, probs.numel()))
    return Prediction(target_token_id=target, rank=rank, prob=float(probs[target]), hits={k: rank < k for k in TOP_K},
                      top_ids=top.indices.tolist(), top_probs=top.values.tolist(), finite=True)


def answer_logprob(logits: torch.Tensor, answer_ids: Sequence[int]) -> float:
    """Sum of log-probabilities of every answer token, teacher-forced (``logits`` are
    ``[len(answer_ids), vocab]``: row i predicts ``answer_ids[i]``)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(list(answer_ids), device=logits.device)
    return float(logp[torch.arange(len(idx), device=logits.device), idx].sum())


# ---------------------------------------------------------------- the table

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
    other_answers: Sequence[int] = ()  # first tokens of the world's other answers (fact_logprob)

    def batch(self) -> Batch:
        """The first scored token as a one-row ``Batch`` in float64 (a row's numbers are exact)."""
        return Batch(self.logits[:1].double(), torch.tensor([self.answer_ids[0]]),
                     None if self.distractor is None else torch.tensor([self.distractor]),
                     None if self.donor_logits is None else torch.log_softmax(self.donor_logits.double(), -1)[None])


Aggregate = Literal["rate", "rank", "mean", "mean_ci", "ratio_of_means"]
Shown = Literal["pct_ci", "number", "mean_ci"]
Scale = Literal["pct", "rank", "value"]


@dataclass(frozen=True)
class Chart:
    """A summary column a figure can draw: its axis label and scale (``pct``: a rate drawn in
    percent, 0-100; ``rank``: 0 is best, log scale on rank + 1; ``value``: as it is)."""

    column: str
    label: str
    scale: Scale = "value"


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One metric. ``meaning``: what it is, with its sign; ``higher_is_better``: which way the
    donor's behaviour lies (None: neither). ``compute`` makes the results column ``name`` from a
    row's inputs (None: not a results column, or derived after scoring from other rows, as
    recovery is); ``batch``: its differentiable form on a ``Batch`` (the one implementation a
    row's ``compute`` also calls; entries with one can be localized, higher meaning more of the
    donor's behaviour), needing a distractor (``needs_distractor``), the world's other answers
    (``needs_answers``) or the donor's distribution (``needs_donor``). ``recovery_of``: the log-probability column whose share of the SFT-PRE gap
    it is. ``aggregate`` names how the summary reduces it (None: not summarized; ``rate``: mean
    of hits, with a bootstrap CI where ``ci``; ``rank``: mean and median; ``mean``; ``mean_ci``:
    mean, CI and count where defined; ``ratio_of_means``: of its ``*_gain`` over ``*_gap``
    columns, with a paired CI and a note). ``paired``: taken by paired differences
    (``pair_skip``: a boolean column whose rows they leave out). ``header`` / ``shown``: its
    column in the report's tables and how its summary value is written; ``console``: its
    column on the console (None: not there); ``chart``: what figures can draw of it;
    ``flags``: a results column of per-row flags the summary counts into ``<name>_note``."""

    name: str
    meaning: str
    higher_is_better: bool | None
    compute: Callable[[ScoreInputs], float | bool | int] | None
    batch: Callable[[Batch], torch.Tensor] | None = None
    needs_distractor: bool = False
    needs_answers: bool = False
    needs_donor: bool = False
    aggregate: Aggregate | None
    ci: bool = False
    paired: bool = False
    pair_skip: str | None = None
    recovery_of: str | None = None
    header: str | None = None
    shown: Shown | None = None
    console: str | None = None
    chart: tuple[Chart, ...] = ()
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


def _row(fn: Callable[[Batch], torch.Tensor], needs: Callable[[ScoreInputs], bool]) -> Callable[[ScoreInputs], float]:
    """A row's value of a ``batch`` form (its one implementation); NaN where ``needs`` fails."""
    return lambda s: float(fn(s.batch())[0]) if needs(s) else float("nan")


def _top(k: int) -> MetricSpec:
    shown = {1: ("top-1 % [95% CI]", "pct_ci", "top-1 %"), 5: ("top-5 % [95% CI]", "pct_ci", "top-5 %")}
    header, kind, console = shown.get(k, (None, None, None))
    return MetricSpec(name=f"top{k}", meaning=f"the answer's first token is among the {k} most likely: higher is better",
                      higher_is_better=True, compute=lambda s: s.prediction.hits[k], aggregate="rate", ci=k in (1, 5),
                      paired=k in (1, 5), header=header, shown=kind, console=console,  # type: ignore[arg-type]
                      chart=(Chart(f"top{k}", f"top-{k} accuracy (%)", "pct"),))


def _fact_row(s: ScoreInputs) -> float:
    """A row's ``fact_logprob`` (NaN without other answers or with non-finite logits)."""
    if not s.other_answers or not s.prediction.finite:
        return float("nan")
    return float(fact_logprob(Batch(s.logits[:1].double(), torch.tensor([s.answer_ids[0]]),
                                    torch.tensor([list(s.other_answers)])))[0])


def _neg_kl_donor(b: Batch) -> torch.Tensor:
    return -kl_donor(b)


METRIC_TABLE: tuple[MetricSpec, ...] = (
    *(_top(k) for k in TOP_K),
    MetricSpec(name="rank", meaning="tokens more likely than the answer's first token (0 = top): lower is better",
               higher_is_better=False, compute=lambda s: s.prediction.rank, aggregate="rank", header="mean rank",
               shown="number", console="mean rank",
               chart=(Chart("mean_rank", "mean target rank (0 = top)", "rank"),
                      Chart("median_rank", "median target rank (0 = top)", "rank"))),
    MetricSpec(name="prob", meaning="p(answer's first token)", higher_is_better=True,
               compute=lambda s: s.prediction.prob, aggregate="mean"),
    MetricSpec(name="first_logprob", meaning="log p(answer's first token), nats: higher is better",
               higher_is_better=True, compute=_row(first_logprob, lambda s: s.prediction.finite), batch=first_logprob,
               aggregate=None),  # recovery's source; localize's default
    MetricSpec(name="fact_logprob", meaning="log p(answer's first token) - mean log p(first tokens of the world's "
               "other answers of the same field), nats: higher is better; 0 change from a donor that raises every "
               "answer alike", higher_is_better=True, compute=_fact_row, batch=fact_logprob, needs_answers=True,
               aggregate="mean_ci", paired=True, header="fact log-prob (nats)", shown="mean_ci",
               chart=(Chart("mean_fact_logprob", "fact-specific log-prob (nats)"),)),  # the claims' effect: what only a fact moves
    MetricSpec(name="answer_logprob", meaning="log p(whole answer), teacher-forced: higher is better",
               higher_is_better=True, aggregate="mean", paired=True,
               compute=lambda s: answer_logprob(s.logits, s.answer_ids[: s.logits.shape[0]])
               if s.prediction.finite else float("nan")),
    MetricSpec(name="logit_diff", meaning="logit[answer] - logit[distractor] (first tokens): higher is better",
               higher_is_better=True, compute=_row(logit_diff, lambda s: s.distractor is not None), batch=logit_diff,
               needs_distractor=True, aggregate="mean_ci", paired=True, header="logit diff vs distractor",
               shown="mean_ci", flags="logit_diff_flag"),  # NaN where refused (``scoring._distractor``)
    MetricSpec(name="kl_donor", meaning="KL(donor || grafted) in nats, >= 0: 0 is the donor, lower is closer",
               higher_is_better=False, compute=_row(kl_donor, lambda s: s.donor_logits is not None), batch=kl_donor,
               needs_donor=True, aggregate="mean_ci", paired=True, header="KL(donor‖graft)", shown="mean_ci"),
    MetricSpec(name="neg_kl_donor", meaning="-KL(donor || grafted) in nats, <= 0: higher (toward 0) is closer to "
               "the donor; localize's KL, whose effects grow as a graft brings the donor's distribution",
               higher_is_better=True, compute=None, batch=_neg_kl_donor, needs_donor=True, aggregate=None),
    MetricSpec(name="recovery", meaning="(grafted - PRE) / (SFT - PRE) of first_logprob: 1 is the donor",
               higher_is_better=True, compute=None, aggregate="ratio_of_means", paired=True,
               pair_skip="recovery_small_gap", recovery_of="first_logprob", header="recovery (first token)",
               shown="mean_ci", console="recovery [95% CI]"),
    MetricSpec(name="recovery_answer", meaning="(grafted - PRE) / (SFT - PRE) of answer_logprob: 1 is the donor",
               higher_is_better=True, compute=None, aggregate="ratio_of_means", recovery_of="answer_logprob",
               header="recovery (whole answer)", shown="mean_ci",
               console="whole-answer recovery"),  # beside it: a weak first token misleads
)


def spec(name: str) -> MetricSpec:
    """The entry called ``name``."""
    for m in METRIC_TABLE:
        if m.name == name:
            return m
    raise KeyError(name)


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


def console_metrics() -> tuple[MetricSpec, ...]:
    """The metrics the console's summary shows, in column order."""
    return tuple(m for m in METRIC_TABLE if m.console is not None)


def chart_labels() -> dict[str, str]:
    """Summary column -> axis label of every metric a chart can draw."""
    return {c.column: c.label for m in METRIC_TABLE for c in m.chart}


def chart_of(column: str) -> tuple[Chart, MetricSpec]:
    """The chart entry of a summary column and its metric (KeyError: no figure draws it)."""
    for m in METRIC_TABLE:
        for c in m.chart:
            if c.column == column:
                return c, m
    raise KeyError(column)


def figure_defaults(k: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(bar chart metrics, heatmap metrics) a run's figures draw by default: top-``k`` and
    top-1 accuracy bars (beside the rank bars), top-``k`` and mean-rank grids."""
    return (("top1",) if k == 1 else (f"top{k}", "top1")), (f"top{k}", "mean_rank")


# Localize configs written before the vocabulary: ``logprob`` is ``first_logprob`` (same
# quantity, same sign); ``kl`` meant -KL there and KL in a sweep's rows, so it is refused.
LEGACY_NAMES: dict[str, str] = {"logprob": "first_logprob"}


def describe(name: str, *, localize: bool = False) -> str:
    """``name: meaning`` for a report's header; with ``localize``, a stored localize run's old
    name is read as what it meant there (``kl`` was -KL(donor || grafted): ``neg_kl_donor``)."""
    new = {**LEGACY_NAMES, "kl": "neg_kl_donor"}.get(name, name) if localize else name
    try:
        return f"{new}: {spec(new).meaning}"
    except KeyError:
        return name


def localize_metrics() -> tuple[str, ...]:
    """The names localize can measure in: the entries with a ``batch`` form where higher is better."""
    return tuple(m.name for m in METRIC_TABLE if m.batch is not None and m.higher_is_better is True)


def localize_metric(name: str) -> MetricSpec:
    """The entry localize measures in (``LEGACY_NAMES`` read as their new names); an unknown
    name, or ``kl`` (two signs), is refused in one line."""
    name = LEGACY_NAMES.get(name, name)
    if name == "kl":
        raise GraftArgumentError("metric 'kl' is ambiguous (it meant -KL in localize, KL in a sweep's rows): use "
                                 "'neg_kl_donor' (-KL(donor || grafted), higher is closer to the donor)")
    if name not in localize_metrics():
        raise GraftArgumentError(f"unknown metric {name!r}; use {', '.join(localize_metrics())}")
    return spec(name)
