"""The claims judged by grafting each claim's region exactly on every prompt, against its null
(``claims.csv``).

For one map (a model pair, a template, a graft direction, a setting) and every claim, per prompt:
the exact effect of grafting the region, of *within* (the cells it is a share of) and of its
null sets (``nulls``), all in one batched engine call. ``share_exact`` is the ratio of sums over
prompts with its Fieller interval (``weightgraft.stats.share_interval``; declined with the reason
in ``interval_note``) at the level in ``ci_level`` (0.95: Fieller's bounds at 99.99999%, docs/statistics.md); ``null_p`` the paired test across prompts that the region beats its null
(``weightgraft.stats.paired_p``; a component claim must beat both its kinds: the larger p);
``null_mean`` the null sets' effect as a share of within. ``share_estimate`` is the same ratio
of the summed gradient estimates of the region's cells and ``interaction`` the ratio of the two.
``region_cells_share`` / ``region_params_share``: the region's part of the within cells and of
their parameters over prompts (what a region of no special role would carry). The per-prompt
effects come back beside the rows (``claims_prompts.parquet``) so any row can be recomputed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from weightgraft.localization.claims.columns import ClaimLevels, ClaimRow, Estimates, NullTests, ThresholdTests
from weightgraft.localization.claims.nulls import NullSets, block_nulls, component_nulls, position_nulls
from weightgraft.localization.claims.regions import CLAIMS, NULL_KINDS, PRE_SFT, Claim, key_frame
from weightgraft.localization.claims.verdicts import decide
from weightgraft.localization.maps import slot_parts
from weightgraft.localization.verify import CellKey
from weightgraft.stats import (
    least_p,
    mean_interval,
    paired_p,
    prompts_needed,
    share_interval,
    share_threshold_p,
    sign_test_p,
)

PromptSet = tuple[tuple[CellKey, ...], ...]  # one sorted key tuple per prompt
# sets -> [n_prompts, n_sets] exact effects in the claims' metric, or [n_prompts, n_sets, 2]: the
# claims' metric, then the plain effect (first_logprob) read off the same passes
Effects = Callable[[Sequence[PromptSet]], np.ndarray]
DRAWS = 20


@dataclass(frozen=True)
class ClaimMap:
    """What the claims of one map need: per prompt its id, the keys it has and their gradient
    estimates, the exact effects of per-prompt key sets, the parameters of each slot, the depth."""

    keys: Sequence[set[CellKey]]
    estimates: Sequence[Mapping[CellKey, float]]
    effects: Effects
    params: Mapping[str, int]
    n_layers: int
    # per prompt, the exact single-cell effects where the run mapped them (``exact``)
    exact_cells: Sequence[Mapping[CellKey, float]] = ()
    prompt_ids: Sequence[str] = ()


def even_spread_threshold(claim: Claim, params_share: float) -> float:
    """A component claim's threshold, stated against what an update spread evenly over the
    parameters gives: its region would carry its parameter share. "O + FFN carry most" must
    exceed their share of within's parameters (0.84 of the last quarter's attention + O + FFN
    in SmolLM2-135M), "q/k/v add little" must stay under theirs; other claims keep their own."""
    if claim.null != "components" or not np.isfinite(params_share):
        return claim.threshold
    return max(claim.threshold, params_share) if claim.above else min(claim.threshold, params_share)


def _threshold_note(claim: Claim, threshold: float, params_share: float) -> str:
    if threshold == claim.threshold or not np.isfinite(threshold):
        return ""
    return (f"the stated {claim.threshold:g} moved to the region's parameter share {params_share:.3g}: an even "
            "spread over the parameters would carry that much, so only past it is the claim told from one")


def null_seed(seed: int, label: str, claim: str, prompt: str, kind: str) -> str:
    """The seed string of one prompt's null draws of one kind (distinct per map and claim)."""
    return f"{seed}:{label}:{claim}:{prompt}:{kind}"


def _pick(pred, keys: list[CellKey], frame: pd.DataFrame, n_layers: int) -> list[CellKey]:
    return [k for k, m in zip(keys, pred(frame, n_layers).to_numpy(bool)) if m]


def _frozen(keys: Sequence[CellKey]) -> tuple[CellKey, ...]:
    return tuple(sorted(set(keys)))


@dataclass
class _Plan:
    claim: Claim
    region: list[list[CellKey]]
    within: list[list[CellKey]]
    rest: list[list[CellKey]]  # within minus region (the marginal's other term)
    nulls: dict[str, list[NullSets]]  # kind -> per prompt


def _plan(claim: Claim, data: ClaimMap, frames: list[tuple[list[CellKey], pd.DataFrame]], label: str, seed: int,
          draws: int) -> _Plan:
    region, within, pools, nulls = [], [], [], {}
    picked: dict[tuple[int, int], list[CellKey]] = {}  # prompts with the same cells share one frame

    def pick(pred, keys: list[CellKey], frame: pd.DataFrame) -> list[CellKey]:
        if (id(pred), id(frame)) not in picked:
            picked[(id(pred), id(frame))] = _pick(pred, keys, frame, data.n_layers)
        return list(picked[(id(pred), id(frame))])

    for keys, frame in frames:
        region.append(pick(claim.region, keys, frame))
        within.append(pick(claim.within, keys, frame))
        avoid = set(pick(claim.null_avoid, keys, frame)) if claim.null_avoid else set()
        pools.append([k for k in within[-1] if k not in avoid])
    rest = [[k for k in w if k not in r_set] for r, w in zip(region, within) for r_set in [set(r)]]
    ids = list(data.prompt_ids) or [str(i) for i in range(len(region))]
    if claim.null == "complement":
        nulls["complement"] = [NullSets([r]) for r in rest]
    elif claim.null == "positions":
        nulls["positions"] = [position_nulls(r, pool, draws, null_seed(seed, label, claim.name, i, "positions"))
                              for r, pool, i in zip(region, pools, ids)]
    elif claim.null == "components" and claim.marginal:
        among = sorted({slot_parts(s)[1] for w in within for _, s in w} - {slot_parts(s)[1] for r in region for _, s in r})
        nulls["other components"] = [component_nulls(r, set(w), draws, null_seed(seed, label, claim.name, i, "components"),
                                                     among, data.params) for r, w, i in zip(region, within, ids)]
    elif claim.null == "components":
        nulls["layer blocks"] = [block_nulls(r, have, data.n_layers) for r, have in zip(region, data.keys)]
        nulls["other components"] = [component_nulls(r, have, draws, null_seed(seed, label, claim.name, i, "components"),
                                                     params=data.params) for r, have, i in zip(region, data.keys, ids)]
    return _Plan(claim, region, within, rest, nulls)


def _kind_sets(plan: _Plan, kind: str, seed: str) -> list[list[list[CellKey]]] | str:
    """The kind's null sets as [draw][prompt] key lists (the fewest draws any prompt has; a prompt
    with more gives that many drawn at random among its own, seeded, not its first ones), or why
    the kind has none."""
    per = plan.nulls[kind]
    missing = next((n.missing for n in per if n.missing), "")
    k = min((len(n.sets) for n in per), default=0)
    if missing or k == 0:
        return missing or "no null set"
    chosen = [n.sets if len(n.sets) == k else [n.sets[j] for j in sorted(
        random.Random(f"{seed}:{kind}:{i}").sample(range(len(n.sets)), k))] for i, n in enumerate(per)]
    if plan.claim.marginal:  # the marginal of the other set: within minus it
        return [[[key for key in w if key not in drop] for sets, w in zip(chosen, plan.within) for drop in [set(sets[j])]]
                for j in range(k)]
    return [[sets[j] for sets in chosen] for j in range(k)]


def _exact_cells_share(data: ClaimMap, region: list[list[CellKey]], within: list[list[CellKey]]) -> float:
    """The region's share of the summed exact single-cell effects, where every prompt has an
    exact effect for each of its cells of within (else NaN: a partial sum is no share)."""
    if len(data.exact_cells) != len(data.keys):
        return float("nan")
    num = den = 0.0
    for r, w, exact in zip(region, within, data.exact_cells):
        if any(k not in exact for k in w):
            return float("nan")
        den += sum(exact[k] for k in w)
        num += sum(exact[k] for k in r)
    return num / den if den else float("nan")


def judge_claims(data: ClaimMap, label: str, setting: str = PRE_SFT, *, claims: Sequence[Claim] = CLAIMS,
                 draws: int = DRAWS, seed: int = 0, n_resamples: int = 9999, precondition: str = "",
                 sign: int = 1, estimates_of: str = "share_exact") -> tuple[list[ClaimRow], pd.DataFrame]:
    """``(rows, per_prompt)``: one claims.csv row per claim (verdicts judged with this map as the
    family; ``stage.write_claims`` judges the run's rows again as one family), and the per-prompt
    effects (claim, prompt id, region, within, null mean per kind). ``sign``: the way the donor
    moves the metric when it carries the finetuned behaviour (+1 grafting SFT into PRE, -1 the
    other way); a map whose whole graft does not move it that way has no effect to localize.
    ``estimates_of``: the share column in the metric the gradient estimates were taken in
    (``share_exact``, ``share_plain``, or "" where neither: no interaction is reported)."""
    frames = _frames(data)
    plans = [_plan(c, data, frames, label, seed, draws) for c in claims]
    columns, kinds = _measure(data, plans, label, seed)
    judge = _Judge(data, columns, kinds, setting=setting, seed=seed, n_resamples=n_resamples, precondition=precondition,
                   sign=sign, estimates_of=estimates_of)
    rows, prompts = [], []
    for plan in plans:
        row, record = judge.claim(plan)
        rows.append(row)
        prompts.append(record)
    judged = decide(pd.DataFrame(rows))
    for row, (_, r) in zip(rows, judged.iterrows()):
        row.update(p=float(r["p"]), p_parts=r["p_parts"], p_holm=float(r["p_holm"]), verdict=r["verdict"], reason=r["reason"])
    per_prompt = pd.concat(prompts, ignore_index=True) if prompts else pd.DataFrame()
    return rows, per_prompt


def _frames(data: ClaimMap) -> list[tuple[list[CellKey], pd.DataFrame]]:
    """Per prompt, its sorted keys and their frame (prompts with the same keys share one frame)."""
    frames, by_cells = [], {}
    for have in data.keys:
        keys = sorted(have)
        if tuple(keys) not in by_cells:
            by_cells[tuple(keys)] = key_frame(keys)
        frames.append((keys, by_cells[tuple(keys)]))
    return frames


class _Columns:
    """Every per-prompt key set the claims need, measured in one engine call, then read back by
    set: ``col(sets)`` the claims' metric over prompts, ``col(sets, plain=True)`` the plain effect."""

    def __init__(self) -> None:
        self.index: dict[PromptSet, int] = {}
        self.effects = self.plain = np.zeros((0, 0))

    def want(self, per_prompt: Sequence[Sequence[CellKey]]) -> None:
        self.index.setdefault(tuple(_frozen(k) for k in per_prompt), len(self.index))

    def measure(self, data: ClaimMap) -> None:
        both = np.asarray(data.effects(list(self.index)), dtype=float) if data.keys else np.zeros((0, len(self.index)))
        self.effects = both[..., 0] if both.ndim == 3 else both
        self.plain = both[..., 1] if both.ndim == 3 and both.shape[2] > 1 else self.effects

    def col(self, per_prompt: Sequence[Sequence[CellKey]], *, plain: bool = False) -> np.ndarray:
        return (self.plain if plain else self.effects)[:, self.index[tuple(_frozen(k) for k in per_prompt)]]


# (claim, null kind) -> its null sets [draw][prompt], or why the kind has none
_Kinds = dict[tuple[str, str], list[list[list[CellKey]]] | str]


def _measure(data: ClaimMap, plans: Sequence[_Plan], label: str, seed: int) -> tuple[_Columns, _Kinds]:
    """The exact effects of the whole graft and of every claim's region, within, rest and null
    sets, in one call; and each claim's null sets by kind (or why a kind has none)."""
    columns = _Columns()
    columns.want([sorted(h) for h in data.keys])
    kinds: _Kinds = {}
    for plan in plans:
        for part in (plan.region, plan.within, plan.rest):
            columns.want(part)
        for kind in plan.nulls:
            got = _kind_sets(plan, kind, f"{seed}:{label}:{plan.claim.name}")
            kinds[(plan.claim.name, kind)] = got
            if not isinstance(got, str):
                for s in got:
                    columns.want(s)
    columns.measure(data)
    return columns, kinds


@dataclass
class _Judge:
    """One map's claims judged row by row against the effects measured for them."""

    data: ClaimMap
    columns: _Columns
    kinds: _Kinds
    setting: str
    seed: int
    n_resamples: int
    precondition: str
    sign: int
    estimates_of: str
    whole: np.ndarray = field(init=False)  # the whole graft's effect per prompt (claims' metric, then plain)
    whole_plain: np.ndarray = field(init=False)
    whole_iv: Any = field(init=False)
    ids: list[str] = field(init=False)

    def __post_init__(self) -> None:
        everything = [sorted(h) for h in self.data.keys]
        self.whole = self.columns.col(everything)
        self.whole_plain = self.columns.col(everything, plain=True)
        self.whole_iv = mean_interval(self.whole) if len(self.whole) else None  # the donor's whole effect: one per map
        self.ids = list(self.data.prompt_ids) or [str(i) for i in range(len(self.data.keys))]

    def claim(self, plan: _Plan) -> tuple[ClaimRow, pd.DataFrame]:
        """The claim's claims.csv row (levels, threshold tests, null tests, estimates) and its per-prompt effects."""
        claim, col = plan.claim, self.columns.col
        n_region = sum(len(r) for r in plan.region)
        den = col(plan.within)
        num = den - col(plan.rest) if claim.marginal else col(plan.region)
        den_plain = col(plan.within, plain=True)
        num_plain = den_plain - col(plan.rest, plain=True) if claim.marginal else col(plan.region, plain=True)
        params = self.data.params
        p_within = sum(params.get(s, 0) for w in plan.within for _, s in w)
        params_share = sum(params.get(s, 0) for r in plan.region for _, s in r) / p_within if p_within else np.nan
        threshold = even_spread_threshold(claim, params_share)
        share = share_interval(num, den) if len(den) else None
        row: ClaimRow = {**self._levels(plan, num, den, num_plain, den_plain, share, threshold, params_share, n_region)}
        if claim.judged and len(den):
            row.update(self._threshold_tests(claim, num, den, threshold, share))
        record = pd.DataFrame({"claim": claim.name, "prompt_id": self.ids, "region_effect": num, "within_effect": den,
                               "whole_effect": self.whole, "region_effect_plain": num_plain,
                               "within_effect_plain": den_plain, "whole_effect_plain": self.whole_plain})
        row.update(self._null_tests(plan, num, den, n_region, record))
        row.update(self._estimates(plan, row, n_region, params_share))
        return row, record

    def _levels(self, plan: _Plan, num: np.ndarray, den: np.ndarray, num_plain: np.ndarray, den_plain: np.ndarray,
                share: Any, threshold: float, params_share: float, n_region: int) -> ClaimLevels:
        """The row's statement, threshold and effects: whole, region, within and the share with its interval."""
        claim, whole, whole_iv = plan.claim, self.whole, self.whole_iv
        setting = self.setting
        within = mean_interval(den) if len(den) else None
        return ClaimLevels(
            claim=claim.name, statement=claim.statement, setting=setting, paper_setting=claim.paper_setting,
            in_paper_setting=setting == claim.paper_setting, threshold=threshold, threshold_stated=claim.threshold,
            threshold_note=_threshold_note(claim, threshold, params_share), side=">" if claim.above else "<",
            n_prompts=len(self.data.keys), n_region_keys=n_region, null_kind=claim.null, null=NULL_KINDS[claim.null],
            seed=self.seed, precondition=self.precondition,
            whole_effect=float(whole.mean()) if len(whole) else np.nan,
            expected_sign=self.sign, least_p=least_p(len(den), n_resamples=self.n_resamples),
            whole_ci_low=whole_iv.low if whole_iv else np.nan,
            whole_ci_high=whole_iv.high if whole_iv else np.nan,
            whole_effect_plain=float(self.whole_plain.mean()) if len(self.whole_plain) else np.nan,
            region_effect_plain=float(num_plain.mean()) if len(num_plain) else np.nan,
            within_effect_plain=float(den_plain.mean()) if len(den_plain) else np.nan,
            share_plain=float(num_plain.sum() / den_plain.sum()) if len(den_plain) and den_plain.sum() else np.nan,
            region_effect=float(num.mean()) if len(num) else np.nan,
            within_effect=within.value if within else np.nan,
            within_ci_low=within.low if within else np.nan,
            within_ci_high=within.high if within else np.nan,
            within_note=within.declined if within else "",
            share_exact=share.value if share else np.nan, ci_low=share.low if share else np.nan,
            ci_high=share.high if share else np.nan,
            # the level the bounds are at: 0.99 where skew widened them (``share.widened``)
            ci_level=share.level if share else np.nan, interval_note=share.declined if share else "")

    def _threshold_tests(self, claim: Claim, num: np.ndarray, den: np.ndarray, threshold: float,
                         share: Any) -> ThresholdTests:
        """Where skew declines the interval: on how many prompts is the share past the threshold,
        and about how many prompts like these would decide an undecided row."""
        past = num - threshold * den
        past_side = share is not None and (share.low > threshold if claim.above else share.high < threshold)
        return ThresholdTests(
            # declined (unbounded at the level skew calls for): no threshold test, the row is undecided
            threshold_p=(share_threshold_p(num, den, threshold, above=claim.above)
                         if share is not None and not np.isnan(share.low) else np.nan),
            n_past_threshold=int((past > 0).sum() if claim.above else (past < 0).sum()),
            sign_p_past=sign_test_p(past, alternative="greater" if claim.above else "less"),
            sign_p_short=sign_test_p(past, alternative="less" if claim.above else "greater"),
            prompts_needed=(np.nan if past_side else
                            prompts_needed(num, den, threshold, above=claim.above, seed=self.seed)))

    def _null_tests(self, plan: _Plan, num: np.ndarray, den: np.ndarray, n_region: int,
                    record: pd.DataFrame) -> NullTests:
        """The region against each kind of its null (paired across prompts; a region must beat
        every kind: the larger p, an intersection-union test); each kind's per-prompt mean goes to ``record``."""
        claim = plan.claim
        p_values, null_shares, drawn, unmatched, notes = [], [], [], 0, []
        for kind in plan.nulls:
            got = self.kinds[(claim.name, kind)]
            if isinstance(got, str):
                notes.append(f"{kind}: {got}")
                p_values.append(np.nan)
                continue
            null = np.stack([self.columns.col(s) for s in got], axis=1)  # [prompts, draws]
            if claim.marginal:
                null = den[:, None] - null
            p_values.append(paired_p(num, null, alternative="greater" if claim.above else "less", seed=self.seed,
                                     n_resamples=self.n_resamples) if n_region else np.nan)
            null_shares.append(float(null.mean(1).sum() / den.sum()) if den.sum() else np.nan)
            ratio = float(np.mean([n.param_ratio for n in plan.nulls[kind]]))
            drawn.append(f"{kind} ({null.shape[1]} per prompt" + (f", {ratio:.2f}x the region's parameters)"
                                                                    if kind == "other components" else ")"))
            unmatched += sum(n.n_unmatched for n in plan.nulls[kind])
            record[f"null_mean_{kind.replace(' ', '_')}"] = null.mean(1)
        judged = claim.judged and p_values and not np.isnan(p_values).any()
        return NullTests(null_p=float(max(p_values)) if judged else np.nan,
                         null_p_by_kind="; ".join(f"{k}: {p:.4g}" for k, p in zip(plan.nulls, p_values)),
                         null_mean=float(np.mean(null_shares)) if null_shares else np.nan,
                         null_drawn="; ".join(drawn + notes) or "none", n_null_unmatched=unmatched)

    def _estimates(self, plan: _Plan, row: Mapping[str, Any], n_region: int, params_share: float) -> Estimates:
        """The gradient estimates' share of the region, its ratio to the exact share (the
        interaction), and the region's share of the within cells and of their parameters."""
        data = self.data
        est_num = sum(e.get(k, 0.0) for e, r in zip(data.estimates, plan.region) for k in r)
        est_den = sum(e.get(k, 0.0) for e, w in zip(data.estimates, plan.within) for k in w)
        share_est = est_num / est_den if est_den else np.nan
        n_within = sum(len(w) for w in plan.within)
        return Estimates(share_estimate=share_est, share_exact_cells=_exact_cells_share(data, plan.region, plan.within),
                         interaction=row[self.estimates_of] / share_est if share_est and self.estimates_of else np.nan,
                         region_cells_share=n_region / n_within if n_within else np.nan,
                         region_params_share=params_share)
