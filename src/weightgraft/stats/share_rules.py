"""Issue 66's comparison of rules for a share's interval (docs/statistics.md, "The criterion and
the designs, fixed before the comparison"): every candidate rule on every design of
:func:`~weightgraft.stats.share_designs.criterion_designs`, vectorized over a design's samples so
the 114 designs x 2,000 samples x every rule run in minutes on 2 cores, not hours."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from weightgraft.stats.means import SHARE_WIDENING, share_level
from weightgraft.stats.share_designs import ShareDesign, criterion_designs, miss_bound


@dataclass(frozen=True)
class Batch:
    """One design's seeded samples and what every rule reads of them (one entry per sample)."""

    n: int
    truth: float
    moments: tuple[np.ndarray, ...]  # mean region, mean whole, var/n of each and their covariance (whole's mean >= 0)
    share: np.ndarray
    g: np.ndarray  # the largest moment skewness of the whole effect and of the residuals (the shipped rule's)
    tail: np.ndarray  # the largest quantile tail ratio of the whole effect and of the residuals (:func:`tail_ratio`)
    resid_skew: np.ndarray  # the residuals' skewness, signed (the skew-corrected quantiles read it)
    trend: np.ndarray  # rank correlation of the residuals with the whole effect, times sqrt(n - 1)


def _skew(x: np.ndarray) -> np.ndarray:
    d = x - x.mean(-1, keepdims=True)
    m2 = (d * d).mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m2 > 1e-30, (d ** 3).mean(-1) / np.maximum(m2, 1e-300) ** 1.5, 0.0)


def tail_ratio(x: np.ndarray) -> np.ndarray:
    """How much longer one tail is than the other, read from quantiles, not moments: the larger of
    ``(q90 - q50) / (q50 - q10)`` and its inverse (1 for a symmetric law, 3.6 for a lognormal of
    sigma 1, 6.8 for sigma 1.5), along the last axis. A sample that lacks the few largest prompts
    still shows the long tail here, where its moment skewness does not."""
    q10, q50, q90 = np.quantile(x, [0.1, 0.5, 0.9], axis=-1)
    up, down = q90 - q50, q50 - q10
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.maximum(up / down, down / up)
    return np.where(np.isfinite(ratio), ratio, np.inf)


def _trend(resid: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Spearman's correlation of the residuals with the whole effect, times ``sqrt(n - 1)`` (about
    N(0, 1) where the share does not change with the effect's size)."""
    a, b = (np.argsort(np.argsort(x, -1), -1).astype(float) for x in (resid, w))
    a, b = a - a.mean(-1, keepdims=True), b - b.mean(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    return np.nan_to_num(rho) * np.sqrt(w.shape[-1] - 1)


def moments(r: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
    """Mean region, mean whole, var/n of each and their covariance, of samples ``[..., n]``, both
    negated where the whole's mean is below 0 (the same ratio): what Fieller's bounds read."""
    n = r.shape[-1]
    flip = np.where(w.mean(-1) < 0, -1.0, 1.0)[..., None]
    r, w = r * flip, w * flip
    mr, mw = r.mean(-1), w.mean(-1)
    dr, dw = r - mr[..., None], w - mw[..., None]
    return mr, mw, (dr * dr).sum(-1) / (n - 1) / n, (dw * dw).sum(-1) / (n - 1) / n, (dr * dw).sum(-1) / (n - 1) / n


def pieces(r: np.ndarray, w: np.ndarray) -> tuple:
    """Moments, share, moment skewness, tail ratio, residual skewness and trend of samples ``[..., n]``."""
    flip = np.where(w.mean(-1) < 0, -1.0, 1.0)[..., None]
    r, w = r * flip, w * flip
    share = r.sum(-1) / w.sum(-1)
    resid = r - share[..., None] * w
    moments_ = moments(r, w)
    g = np.maximum(np.abs(_skew(w)), np.abs(_skew(resid)))
    return moments_, share, g, np.maximum(tail_ratio(w), tail_ratio(resid)), _skew(resid), _trend(resid, w)


def draw_batch(design: ShareDesign, sims: int, seed: int) -> Batch:
    """``sims`` samples of ``design`` from one generator seeded ``seed``, drawn one after another
    as ``design.draw`` gives them (a loop over ``share_interval`` on the same seed sees the same)."""
    rng = np.random.default_rng(seed)
    drawn = [design.draw(rng) for _ in range(sims)]
    r, w = np.stack([d[0] for d in drawn]), np.stack([d[1] for d in drawn])
    return Batch(design.n, design.truth, *pieces(r, w))


def fieller(moments: tuple[np.ndarray, ...], q_low: np.ndarray, q_high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fieller's bounds, vectorized: the thetas where the pivot ``mean(r - theta * w) / se`` lies in
    ``[q_low, q_high]`` (NaN where unbounded)."""
    mr, mw, vrr, vww, vrw = moments

    def root(c: np.ndarray, upper: np.ndarray) -> np.ndarray:
        a = mw * mw - c * c * vww
        b = mr * mw - c * c * vrw
        root = np.sqrt(np.maximum(b * b - a * (mr * mr - c * c * vrr), 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, np.where(upper, b + root, b - root) / a, np.nan)

    q_low, q_high = np.broadcast_to(q_low, mr.shape), np.broadcast_to(q_high, mr.shape)
    return root(np.abs(q_high), q_high < 0), root(np.abs(q_low), q_low <= 0)


Rule = Callable[[Batch], tuple[np.ndarray, np.ndarray, np.ndarray]]  # -> low, high (NaN: declined), level


def _t(n: int, level: np.ndarray | float) -> np.ndarray:
    return sps.t.ppf(0.5 + np.asarray(level, float) / 2, n - 1)


def _at_levels(b: Batch, level: np.ndarray, declined: np.ndarray | None = None, skew_corrected: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fieller's interval at each sample's own level; declined where the whole effect's interval at
    that level includes 0 (unbounded), or where ``declined``."""
    level = np.broadcast_to(np.asarray(level, float), b.share.shape)
    t = np.where(np.isfinite(level), _t(b.n, np.where(np.isfinite(level), level, 0.5)), np.nan)
    shift = b.resid_skew * (2 * t * t + 1) / (6 * np.sqrt(b.n)) if skew_corrected else 0.0
    low, high = fieller(b.moments, -t - shift, t - shift)
    if declined is not None:
        low, high = np.where(declined, np.nan, low), np.where(declined, np.nan, high)
    return low, high, level


def fixed_level(level: float, skew_corrected: bool = False) -> Rule:
    """Fieller at one level for every sample (skew-corrected quantiles where asked)."""
    return lambda b: _at_levels(b, np.full(b.share.shape, level), skew_corrected=skew_corrected)


def shipped_rule(level: float = 0.95) -> Rule:
    """The rule adopted (:func:`~weightgraft.stats.means.share_interval`): Fieller's bounds at
    ``share_level(level)`` on every sample, the printed level ``level``."""
    def rule(b: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        low, high, _ = _at_levels(b, np.full(b.share.shape, share_level(level)))
        return low, high, np.full(b.share.shape, level)

    return rule


def moment_skew_rule(factor: float = 100.0, wide: float = 0.99) -> Rule:
    """The rule shipped before issue 66's adoption: 95%, ``wide`` where ``n < factor * g**2``."""
    return lambda b: _at_levels(b, np.where(b.n < factor * b.g ** 2, wide, 0.95))


def tail_rule(steps: tuple[tuple[float, float], ...], decline_above: float, skew_corrected: bool = False) -> Rule:
    """Fieller at a level set by the tail ratio: the level of the first ``(ratio, level)`` step the
    sample's tail ratio lies below (95% below the first), declined at or above ``decline_above``."""
    def rule(b: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        level = np.full(b.share.shape, 0.95)
        for ratio, lev in sorted(steps, reverse=True):
            level = np.where(b.tail >= ratio, lev, level)
        return _at_levels(b, level, b.tail >= decline_above, skew_corrected)

    return rule


def trend_rule(level: float, trend_above: float, tail_above: float = 0.0) -> Rule:
    """Fieller at ``level``, declined where the share changes with the effect's size (``|trend| >=
    trend_above``) and the tail ratio is at least ``tail_above``: where the ratio of sums rests on
    the largest prompts, which a sample of a few dozen may not hold."""
    return lambda b: _at_levels(b, np.full(b.share.shape, level), (np.abs(b.trend) >= trend_above) & (b.tail >= tail_above))


def rates(b: Batch, rule: Rule) -> dict[str, float]:
    """One rule on one design: intervals given, each one-sided miss rate over them, the decline
    rate, the bound each miss rate is held to, and the median width over Fieller's 95% interval."""
    low, high, _ = rule(b)
    given = np.isfinite(low) & np.isfinite(high)
    k = int(given.sum())
    base_low, base_high, _ = fixed_level(0.95)(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        width = ((high - low) / (base_high - base_low))[given & np.isfinite(base_low)]
    nan = float("nan")
    return {"given": k, "miss_low": float((b.truth < low[given]).mean()) if k else nan,
            "miss_high": float((b.truth > high[given]).mean()) if k else nan,
            "declined": 1 - k / len(low), "bound": miss_bound(k), "width": float(np.median(width)) if width.size else nan}


P_ALPHAS = (0.05, 0.01, 0.05 / 26)  # a row's own level, a stricter one, Holm's first step over 26 judged rows


def p_rates(b: Batch, widening: float = SHARE_WIDENING, alphas: tuple[float, ...] = P_ALPHAS) -> dict[str, float]:
    """The threshold p (:func:`~weightgraft.stats.means.share_threshold_p` with ``widening``) at the
    true ratio, on each side: how often ``p <= alpha`` (a claim at the truth holding falsely), per
    alpha and side, with ``bound_<alpha>`` the most it may be (alpha plus three Monte Carlo errors)."""
    mr, mw, vrr, vww, vrw = b.moments
    th = b.truth
    se = np.sqrt(np.maximum(vrr - 2 * th * vrw + th * th * vww, 1e-300))
    stat = (mr - th * mw) / se
    out: dict[str, float] = {}
    for side, s in (("above", stat), ("below", -stat)):
        p = np.minimum(1.0, 2.0 * sps.t.sf(s, b.n - 1) * widening)
        for a in alphas:
            out[f"{side}_{a:.4g}"] = float((p <= a).mean())
    for a in alphas:
        out[f"bound_{a:.4g}"] = a + 3 * float(np.sqrt(a * (1 - a) / len(b.share)))
    return out


def p_passes(r: dict[str, float], alphas: tuple[float, ...] = P_ALPHAS) -> bool:
    """Each side's false-hold rate within its bound at every alpha."""
    return all(r[f"{side}_{a:.4g}"] <= r[f"bound_{a:.4g}"] for side in ("above", "below") for a in alphas)


def passes(r: dict[str, float]) -> bool:
    """Each one-sided miss rate within its bound (none given passes)."""
    return not r["given"] or max(r["miss_low"], r["miss_high"]) <= r["bound"]


def compare(rules: dict[str, Rule], sims: int, seed: int, designs: list[ShareDesign] | None = None
            ) -> tuple[list[ShareDesign], dict[str, list[dict[str, float]]]]:
    """Every rule on every design (design j seeded ``seed + j``, ``sims`` samples each)."""
    designs = criterion_designs() if designs is None else designs
    out: dict[str, list[dict[str, float]]] = {name: [] for name in rules}
    for j, d in enumerate(designs):
        b = draw_batch(d, sims, seed + j)
        for name, rule in rules.items():
            out[name].append(rates(b, rule))
    return designs, out


def candidates() -> dict[str, Rule]:
    """Every rule the comparison runs (docs/statistics.md lists them), by the name its tables print."""
    out: dict[str, Rule] = {"fieller 95%": fixed_level(0.95),
                            "before issue 66 (99% where n < 100 g^2)": moment_skew_rule()}
    for level in (0.99, 0.999, 0.9999, 0.99999, 0.999999, 0.9999999):  # the last three added while comparing
        out[f"fieller {100 * level:.10g}%"] = fixed_level(level)
    for level in (0.95, 0.99, 0.999):
        out[f"skew-corrected quantiles {100 * level:g}%"] = fixed_level(level, skew_corrected=True)
    for cut in (2.0, 3.0, 4.0):
        out[f"tail ratio: 99% from 2, 99.9% from 3, declined from {cut:g}"] = tail_rule(((2.0, 0.99), (3.0, 0.999)), cut)
    for level in (0.99, 0.999):
        for z in (1.0, 2.0):
            out[f"fieller {100 * level:g}%, declined where abs(trend) >= {z:g}"] = trend_rule(level, z)
            out[f"fieller {100 * level:g}%, declined where abs(trend) >= {z:g} and tail ratio >= 2"] = trend_rule(level, z, 2.0)
    return out


WIDENINGS = (5_000.0, 50_000.0, 500_000.0)  # 99.999%, 99.9999%, 99.99999% for 95%: the levels that pass the intervals


def compare_p(sims: int, seed: int, widenings: tuple[float, ...] = WIDENINGS, designs: list[ShareDesign] | None = None
              ) -> tuple[list[ShareDesign], dict[float, list[dict[str, float]]]]:
    """The threshold p's false-hold rates (:func:`p_rates`) at each widening, on every design
    (design j seeded ``seed + j``, the samples :func:`compare` draws)."""
    designs = criterion_designs() if designs is None else designs
    out: dict[float, list[dict[str, float]]] = {w: [] for w in widenings}
    for j, d in enumerate(designs):
        b = draw_batch(d, sims, seed + j)
        for w in widenings:
            out[w].append(p_rates(b, w))
    return designs, out


def family(d: ShareDesign) -> str:
    """The design's family as the summary table groups it (D1 lognormal apart from D1's others)."""
    if d.kind == "family":
        return "D1 lognormal / mirrored" if "lognormal" in d.family else "D1 normal / t3"
    label = d.label.split(",")[0]
    return f"{label}, sigma {d.sigma:g}" if d.kind in ("constant", "linear", "logistic") else label


def summary(designs: list[ShareDesign], results: dict[str, list[dict[str, float]]]) -> list[list[str]]:
    """Per rule: designs passed, the worst one-sided miss per family (``**`` above its bound somewhere
    in it) and the mean decline rate."""
    families = list(dict.fromkeys(family(d) for d in designs))
    rows = []
    for name, rs in results.items():
        cells = []
        for fam in families:
            mine = [r for d, r in zip(designs, rs) if family(d) == fam and r["given"]]
            worst = max((max(r["miss_low"], r["miss_high"]) for r in mine), default=float("nan"))
            cells.append(f"{worst:.3f}" + ("" if all(passes(r) for r in mine) else " **"))
        rows.append([name, f"{sum(passes(r) for r in rs)} of {len(rs)}", *cells, f"{np.mean([r['declined'] for r in rs]):.3f}"])
    return rows


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - prints docs/statistics.md's table
    import argparse

    parser = argparse.ArgumentParser(prog="python -m weightgraft.stats.share_rules")
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args(argv)
    designs, results = compare(candidates(), args.sims, args.seed)
    families = list(dict.fromkeys(family(d) for d in designs))
    print("| rule | designs passed | " + " | ".join(families) + " | mean declined |")
    print("|---|" + "---:|" * (len(families) + 2))
    for row in summary(designs, results):
        print("| " + " | ".join(row) + " |")
    for name, rs in results.items():
        failed = [f"{d.label} n {d.n} ratio {d.truth:g}: {r['miss_low']:.3f}/{r['miss_high']:.3f} ({r['given']})"
                  for d, r in zip(designs, rs) if not passes(r)]
        print(f"\n{name}: fails {len(failed)}: " + "; ".join(failed))
    _, p_results = compare_p(args.sims, args.seed, designs=designs)
    print("\n| widening (Fieller's level for 95%) | designs passed | " + " | ".join(
        f"worst p <= {a:.3g} (bound at 2,000)" for a in P_ALPHAS) + " |")
    print("|---|---:|" + "---:|" * len(P_ALPHAS))
    for w, rs in p_results.items():
        worst = [max(max(r[f"above_{a:.4g}"], r[f"below_{a:.4g}"]) for r in rs) for a in P_ALPHAS]
        bounds = [rs[0][f"bound_{a:.4g}"] for a in P_ALPHAS]
        print(f"| {w:,.0f} ({100 * (1 - 0.05 / w):.8g}%) | {sum(p_passes(r) for r in rs)} of {len(rs)} | "
              + " | ".join(f"{x:.4f} ({b:.4f})" for x, b in zip(worst, bounds)) + " |")
        for d, r in zip(designs, rs):
            if not p_passes(r):
                bad = [f"{side} {a:.3g}: {r[f'{side}_{a:.4g}']:.4f}" for side in ("above", "below") for a in P_ALPHAS
                       if r[f"{side}_{a:.4g}"] > r[f"bound_{a:.4g}"]]
                print(f"    {w:,.0f} fails {d.label} n {d.n} ratio {d.truth:g}: " + ", ".join(bad))


if __name__ == "__main__":  # pragma: no cover
    main()
