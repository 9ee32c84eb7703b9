"""The seeded simulations that hold :mod:`weightgraft.stats` to its coverage and error rates
(run by the suite, and by ``python -m weightgraft.stats.simulation`` for docs/statistics.md).

Shares (:class:`ShareDesign`, D1-D4 of docs/statistics.md): D1 a whole effect ``w = mu + e1`` and
a region effect ``r = 0.3 * w + 0.3 * e2`` with ``e1, e2`` of mean 0 and sd 1 from one family
(normal, lognormal with sigma 1, its mirror image, Student t with 3 degrees of freedom); ``mu = 1``
(an effect a prompt sample can see) or ``mu = 0.2`` (a denominator near 0). D2-D4 a lognormal whole
effect with a constant per-prompt share, or one that grows with the effect's size. The candidate
rules for the share's interval are compared on them by the criterion docs/statistics.md fixed
(:func:`compare_share_rules`, :func:`choose_rule`). A true null for the paired test: per prompt a
shared prompt effect plus the family's noise, for the region and for each of its null draws alike.
"""

from __future__ import annotations

import functools

import numpy as np

from weightgraft.stats.paired import Alternative, paired_p
from weightgraft.stats.rates import paired_table_ci, rate_ci

# the share designs live in share_designs; the suite and main() read these names here too
from weightgraft.stats.share_designs import (  # noqa: F401
    FAMILIES,
    METHODS,
    SHARE_NS,
    ShareDesign,
    choose_rule,
    compare_share_rules,
    criterion_designs,
    miss_bound,
    noise,
    passes,
    share_designs,
)
from weightgraft.stats.signs import sign_test_p


def null_rejection(family: str, n: int, sims: int, *, draws: int = 20, alpha: float = 0.05, seed: int = 0,
                   n_resamples: int = 999, one_draw_null: bool = False) -> float:
    """How often :func:`paired_p` rejects at ``alpha`` when the region is one more random
    region (``draws`` null draws per prompt; ``one_draw_null``: a 1-D null of one draw each)."""
    rng = np.random.default_rng(seed)
    rejected = 0
    for i in range(sims):
        prompt = 3.0 * rng.standard_normal((n, 1))
        k = 1 if one_draw_null else draws
        null = prompt + noise(family, rng, (n, k))
        region = prompt[:, 0] + noise(family, rng, n)
        p = paired_p(region, null[:, 0] if one_draw_null else null, seed=i, n_resamples=n_resamples)
        rejected += p <= alpha
    return rejected / sims


def skewed_region_rejection(n: int, sims: int, *, alternative: Alternative = "greater", region_family: str = "lognormal",
                            region_sd: float = 1.0, draws: int = 20, alpha: float = 0.05, seed: int = 0,
                            n_resamples: int = 999, relabeling_only: bool = False) -> float:
    """How often :func:`paired_p` (or its relabeling test alone) rejects at ``alpha`` when the
    region has its null draws' mean but not their distribution: per prompt a shared prompt effect,
    normal noise (sd 1) for each null draw, ``region_family``'s noise (mean 0, sd ``region_sd``)
    for the region. Not a null the test is exact under: the region is not exchangeable with its draws."""
    from weightgraft.stats.paired import _exchange_p

    rng = np.random.default_rng(seed)
    sign = 1.0 if alternative == "greater" else -1.0
    rejected = 0
    for i in range(sims):
        prompt = 3.0 * rng.standard_normal((n, 1))
        null = prompt + rng.standard_normal((n, draws))
        region = prompt[:, 0] + region_sd * noise(region_family, rng, n)
        if relabeling_only:
            p = _exchange_p(sign * np.column_stack([region, null]), n_resamples, np.random.default_rng(i))
        else:
            p = paired_p(region, null, alternative=alternative, seed=i, n_resamples=n_resamples)
        rejected += p <= alpha
    return rejected / sims


def sign_rejection(family: str, n: int, sims: int, alpha: float = 0.05, seed: int = 0) -> float:
    """How often :func:`sign_test_p` rejects at ``alpha`` on differences of median 0."""
    median = float(np.median(noise(family, np.random.default_rng(99), 200_000)))
    rows = noise(family, np.random.default_rng(seed), (sims, n)) - median
    return float(np.mean([sign_test_p(row) <= alpha for row in rows]))


def rate_coverage(n: int, rate: float) -> float:
    """The exact coverage of :func:`rate_ci` at a true ``rate`` (a sum over the binomial)."""
    from scipy import stats as sps

    pmf = sps.binom.pmf(np.arange(n + 1), n, rate)
    hit = [(lambda lo_hi: lo_hi[0] <= rate <= lo_hi[1])(rate_ci(k, n)[1:]) for k in range(n + 1)]
    return float(pmf[np.array(hit)].sum())


@functools.lru_cache(maxsize=8)
def _paired_tables(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every 2x2 table of ``n`` prompts (both, a only, b only, neither) and its interval."""
    tables = np.array([(k11, k10, k01, n - k11 - k10 - k01) for k11 in range(n + 1) for k10 in range(n + 1 - k11)
                       for k01 in range(n + 1 - k11 - k10)])
    bounds = np.array([paired_table_ci(*map(int, t))[1:] for t in tables])
    return tables, bounds[:, 0], bounds[:, 1]


def paired_difference_coverage(n: int, rate_a: float, rate_b: float, both: float) -> float:
    """The exact coverage of :func:`paired_table_ci` of ``rate_a - rate_b`` when each prompt is
    hit by both schemes with probability ``both`` (a sum over the multinomial's tables)."""
    from scipy import stats as sps

    probs = np.array([both, rate_a - both, rate_b - both, 1 - rate_a - rate_b + both])
    if probs.min() < -1e-12:
        raise ValueError(f"no joint law has rates {rate_a}, {rate_b} and both {both}")
    tables, low, high = _paired_tables(n)
    mass = sps.multinomial(n, np.clip(probs, 0.0, 1.0)).pmf(tables)
    truth = rate_a - rate_b
    return float(mass[(low - 1e-12 <= truth) & (truth <= high + 1e-12)].sum())


# (rate_a, rate_b, both): independent schemes (both = rate_a * rate_b) and schemes whose hits
# nest (both near min(rate_a, rate_b)), at the rates the paper's component figures show
PAIRED_SETTINGS = ((0.3, 0.25, 0.075), (0.3, 0.25, 0.24), (0.225, 0.175, 0.039), (0.225, 0.175, 0.16),
                   (0.5, 0.3, 0.15), (0.5, 0.3, 0.28), (0.1, 0.05, 0.005), (0.1, 0.05, 0.04), (0.05, 0.05, 0.0025),
                   (0.9, 0.8, 0.72), (0.9, 0.8, 0.78))


def _table(header: list[str], right: int, rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * (len(header) - right) + "---:|" * right)
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def _rule_name(rule: tuple[str, float]) -> str:
    return f"{rule[0]}, f = {rule[1]:g}"


def _rates_row(rates: dict[str, float]) -> list[str]:
    def miss(x: float) -> str:
        return "-" if not rates["given"] else f"{x:.3f}" + ("" if x <= rates["bound"] else " **")

    return [f"{rates['coverage_given']:.3f} ({rates['given']})" if rates["given"] else "- (0)", miss(rates["miss_low"]),
            miss(rates["miss_high"]), f"{rates['bound']:.3f}" if rates["given"] else "-", f"{rates['declined']:.3f}",
            f"{rates['false_less']:.3f}", f"{rates['false_greater']:.3f}", f"{rates['false_less_sign']:.3f}",
            f"{rates['false_greater_sign']:.3f}"]


RATES_HEADER = ["covers (given)", "truth below low", "truth above high", "bound", "declined", "`<` holds", "`>` holds",
                "`<` holds (sign test too)", "`>` holds (sign test too)"]


def share_rules_report(sims: int, seed: int, shown: list[tuple[str, float]],
                       compact: list[tuple[str, float]]) -> None:  # pragma: no cover
    """Prints docs/statistics.md's comparison of the share interval's rules: every rule's summary,
    the one the criterion chooses on this run (overall and per method), per design the rules in
    ``shown`` and those, and the rules in ``compact`` side by side in brief."""
    designs, results = compare_share_rules(sims, seed)
    chosen = choose_rule(results)
    rows = []
    for rule, rates in results.items():
        given = [r for r in rates if r["given"]]
        excess = max(max(r["miss_low"], r["miss_high"]) - r["bound"] for r in given)
        rows.append([rule[0], f"{rule[1]:g}", f"{sum(passes(r) for r in rates)} of {len(rates)}", f"{max(excess, 0):.3f}",
                     f"{np.mean([r['declined'] for r in rates]):.3f}", f"{np.nanmean([r['width'] for r in rates]):.2f}"])
    _table(["method", "f", "designs passed", "largest excess over the bound", "mean declined",
            "width / Fieller 95% (median, mean over designs)"], 4, rows)
    best = [choose_rule(results, m) for m in METHODS]
    print(f"chosen by the criterion on this run (seed {seed}, {sims} samples per design): {_rule_name(chosen)}; "
          f"per method: {'; '.join(_rule_name(b) for b in best)}\n")
    for rule in dict.fromkeys([*shown, chosen, *best]):
        print(f"{_rule_name(rule)}:\n")
        _table(["design", "n", "true ratio", *RATES_HEADER], len(RATES_HEADER) + 1,
               [[d.label, str(d.n), f"{d.truth:g}", *_rates_row(r)] for d, r in zip(designs, results[rule])])
    if compact:
        def brief(r: dict[str, float]) -> list[str]:
            row = _rates_row(r)
            return [f"{row[1]} / {row[2]} ({r['declined']:.2f})", row[7]]

        _table(["design", "n", "true ratio", *(f"{_rule_name(c)}: {x}" for c in compact
                                               for x in ("below / above (declined)", "`<` holds (sign test too)"))],
               2 * len(compact) + 1,
               [[d.label, str(d.n), f"{d.truth:g}", *(x for c in compact for x in brief(results[c][j]))]
                for j, d in enumerate(designs)])


def adopted_report(sims: int, seed: int) -> None:  # pragma: no cover
    """Prints docs/statistics.md's table of :func:`share_interval` as shipped on every criterion
    design (design j seeded ``seed + j``; the suite's run is seed 3000): each one-sided miss over
    the intervals given, the decline rate, and the threshold p's false holds on each side."""
    from weightgraft.stats import share_rules as sr

    rows = []
    for j, d in enumerate(criterion_designs()):
        b = sr.draw_batch(d, sims, seed + j)
        r, p = sr.rates(b, sr.shipped_rule()), sr.p_rates(b)
        worst = [max(p[f"above_{a:.4g}"], p[f"below_{a:.4g}"]) for a in sr.P_ALPHAS]
        rows.append([d.label, str(d.n), f"{d.truth:g}", f"{r['miss_low']:.3f}", f"{r['miss_high']:.3f}",
                     f"{r['bound']:.3f}", f"{r['declined']:.3f}", *(f"{x:.4f}" for x in worst),
                     "yes" if sr.passes(r) and sr.p_passes(p) else "**no**"])
    _table(["design", "n", "true ratio", "truth below the interval", "truth above it", "bound (given)", "declined",
            *(f"p <= {a:.3g} at the truth, worse side" for a in sr.P_ALPHAS), "passes"], 10, rows)


def skewed_region_report(sims: int) -> None:  # pragma: no cover
    """Prints docs/statistics.md's table of the paired test on regions with their draws' mean but
    a skewed distribution."""
    rows = []
    for sd in (1.0, 2.0):
        for family in ("lognormal", "mirrored lognormal"):
            for alternative in ("greater", "less"):
                for n in SHARE_NS:
                    rates = [skewed_region_rejection(n, sims, alternative=alternative, region_family=family, region_sd=sd,
                                                     seed=n, relabeling_only=alone) for alone in (True, False)]
                    rows.append([family, f"{sd:g}", alternative, str(n), *(f"{x:.3f}" for x in rates)])
    _table(["region's noise", "its sd", "alternative", "n", "relabeling test alone rejects", "paired_p rejects"], 4, rows)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - prints docs/statistics.md's tables
    import argparse

    parser = argparse.ArgumentParser(prog="python -m weightgraft.stats.simulation",
                                     description="docs/statistics.md's tables (all but --share-rules without a flag)")
    parser.add_argument("--share-rules", action="store_true", help="compare the share interval's candidate rules")
    parser.add_argument("--share", action="store_true", help="only the share interval as shipped (every criterion design)")
    parser.add_argument("--skewed-region", action="store_true", help="only the paired test on skewed regions")
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1000, help="the first seed of --share-rules and --share")
    parser.add_argument("--show", action="append", default=[], metavar="METHOD:F",
                        help="with --share-rules, a rule to show per design, e.g. 'fieller:8' (repeatable)")
    parser.add_argument("--compact", action="append", default=[], metavar="METHOD:F",
                        help="with --share-rules, a rule to show per design in brief beside the others (repeatable)")
    args = parser.parse_args(argv)
    if args.share_rules:
        def rules(given: list[str]) -> list[tuple[str, float]]:
            return [(m, float(f)) for m, f in (x.rsplit(":", 1) for x in given)]

        share_rules_report(args.sims, args.seed, rules(args.show), rules(args.compact))
        return
    everything = not (args.share or args.skewed_region)
    if args.share or everything:
        adopted_report(args.sims, args.seed)
    if args.skewed_region or everything:
        skewed_region_report(args.sims)
    if not everything:
        return
    cells = [(family, n) for family in FAMILIES for n in (8, 20, 40)]
    _table(["family", "n", "rejects (20 draws per prompt)", "rejects (one-draw 1-D null, sign flip only)"], 3,
           [[f, str(n), f"{null_rejection(f, n, args.sims):.3f}",
             f"{null_rejection(f, n, args.sims, one_draw_null=True):.3f}"] for f, n in cells])
    _table(["family", "n", "the sign test rejects (median 0)"], 2,
           [[f, str(n), f"{sign_rejection(f, n, args.sims):.3f}"] for f, n in cells])
    _table(["n", "least coverage of the rate interval over true rates 0.01-0.99"], 2,
           [[str(n), f"{min(rate_coverage(n, p) for p in np.linspace(0.01, 0.99, 99)):.3f}"] for n in (6, 20, 40)])
    _table(["rate a", "rate b", "both", *(f"coverage at n = {n}" for n in (20, 40, 80))], 6,
           [[f"{a:g}", f"{b:g}", f"{both:g}", *(f"{paired_difference_coverage(n, a, b, both):.3f}" for n in (20, 40, 80))]
            for a, b, both in PAIRED_SETTINGS])


if __name__ == "__main__":  # pragma: no cover
    main()
