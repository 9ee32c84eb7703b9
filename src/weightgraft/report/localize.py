"""The report page of a ``weightgraft localize`` run: where the finetuned behaviour lives, and
how far the found sets can be trusted.

One self-contained HTML page in the run report's look (``report/html.py``: its style and
tables, figures embedded): a header (models, metric, prompts and their directions, exclusions),
heatmaps per (SFT model, direction, template) with the global slots, the stability of the maps
over SFT models and templates, estimates vs exact effects, and the
found sets (searched on fit prompts, judged on held-out ones) with their refinement, random and
matched controls, an estimate of what the ranking missed and how many cells each prompt
received; the paper's claims as exact region grafts against a null. The PNG files stay beside the page.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft import atomic
from weightgraft.engine.architectures import Units
from weightgraft.engine.cells import cell_name
from weightgraft.engine.metric_table import describe
from weightgraft.localization.agreement import agreement
from weightgraft.localization.claims import ALPHA, CLAIMS
from weightgraft.localization.claims.regions import NULL_KINDS
from weightgraft.localization.claims.steps import first_held_text, verdicts_text
from weightgraft.localization.claims.verdicts import FLOOR, p_text, share_text
from weightgraft.localization.config import null_labels, sft_labels
from weightgraft.localization.stability import COLUMNS as STABILITY_COLUMNS
from weightgraft.localization.stability import null_summary, stability_table
from weightgraft.report import localize_figures as figs
from weightgraft.report.claims_page import write_claims_markdown
from weightgraft.report.html import CSS, _esc, html_table
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import LocalizeManifest, ModelEntry, SearchRecord


def value_column(cells: pd.DataFrame) -> str | None:
    """The exact effect where every cell has one, else the gradient estimate; a run without
    estimates (``estimates: false``): the exact effect of the prompts mapped exactly, or None."""
    if cells["exact"].notna().all():
        return "exact"
    if cells["estimate"].notna().any():
        return "estimate"
    return "exact" if cells["exact"].notna().any() else None


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(alt)}">'
            f"<figcaption>{_esc(alt)} ({_esc(path.name)})</figcaption></figure>")


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def _header(run_dir: Path, manifest: LocalizeManifest | Mapping[str, Any], cells: pd.DataFrame) -> str:
    manifest = LocalizeManifest.model_validate(manifest) if isinstance(manifest, Mapping) else manifest
    config = manifest.config
    models = config.get("models", {})
    loaded = manifest.models
    roles: dict[str, str] = {}
    for role, spec in models.items():  # sft: one spec, or a list of them (sft[0], sft[1], ...); nulls: a list
        if role == "sft":
            roles.update(dict(zip(sft_labels(spec), [spec] if isinstance(spec, str) else spec)))
        elif role == "nulls":
            roles.update(dict(zip(null_labels(spec), spec)))
        else:
            roles[role] = spec
    entries = {role: loaded.get(role) or ModelEntry() for role in roles}
    rows = [(role, spec, entries[role].source, entries[role].weights_sha256) for role, spec in roles.items()]
    n_prompts = manifest.n_prompts or cells.groupby("template")["example_id"].nunique().to_dict()
    excluded = manifest.excluded
    facts = [
        ("metric", describe(config.get("metric", "first_logprob"), localize=True)),
        ("graft directions", ", ".join(config.get("graft_directions", []))),
        ("prompts per template", ", ".join(f"{t}: {n}" for t, n in n_prompts.items())),
        ("prompt directions", ", ".join(manifest.prompt_directions) or "n/a"),
        ("direction choice", manifest.directions_note or "n/a"),
        ("exact maps", f"{config.get('exact', 'all')} (prompts per template)"),
        ("attribution", "none (estimates: false)" if config.get("estimates", True) is False else
         f"gradient{', integrated gradients (%s steps)' % config['ig_steps'] if config.get('ig_steps', 0) > 1 else ''}"),
        ("excluded prompts", str(len(excluded))),
        ("dtype / device", f"{config.get('dtype', '')} / {config.get('device', '')}"),
    ]
    parts = [f"<p>directory: <code>{_esc(run_dir)}</code></p>",
             html_table(("role", "spec", "source", "weights sha256"), rows),
             html_table(("setting", "value"), facts)]
    if excluded:
        parts.append("<details><summary>excluded prompts</summary>"
                     + html_table(("template", "example", "reason"),
                                  [(e.get("template", ""), e.get("example_id", ""), e.get("reason", "")) for e in excluded])
                     + "</details>")
    parts.append(f"<details><summary>config</summary><pre>{_esc(json.dumps(config, indent=2))}</pre></details>")
    return "\n".join(parts)


def _controls_cell(stats: dict[str, Any], n_sets: int) -> str:
    """One kind of control on one half: mean / p95 of its shares and the set's empirical p."""
    if not stats:
        return ""
    if "not_drawn" in stats:
        return f'<span class="warn">not drawn: {_esc(stats["not_drawn"])}</span>'

    p = stats.get("p")
    floor = 1 / (1 + n_sets) if n_sets else 0.0  # the empirical p of n controls cannot go below this
    text = f"{_pct(stats.get('mean'))} / {_pct(stats.get('p95'))}" + (
        f", p {p_text(p, floor)}" + (f" (the floor of {n_sets} controls)" if p <= floor * (1 + 1e-9) else "")
        if p is not None else "")
    return text if p is None or p <= 0.05 else f'<span class="warn">{text}</span>'


def _set_row(entry: dict[str, Any], which: str, found: dict[str, Any]) -> tuple[str, ...]:
    c = found.get("controls") or {}
    r, m = c.get("random") or {}, c.get("matched") or {}
    got = found.get("received") or {}
    notes = []
    if c and not c.get("from_complement"):
        notes.append('<span class="warn">controls drawn before they excluded the set\'s own cells</span>')
    if m.get("n_unmatched"):
        notes.append(f"{m['n_unmatched']} matched cells over {c['n_sets']} sets had no key of their group outside "
                     "the set: drawn uniformly from its complement")
    if c and not c.get("agrees", True):
        notes.append('<span class="warn">regrafted share disagrees with the search</span>')
    if not got:
        received = ""
    elif got["min"] == got["max"] == got["size"]:
        received = f"all {got['size']}"
    else:
        received = (f'<span class="warn">{got["min"]}-{got["max"]} of {got["size"]}</span> '
                    f"({got['n_prompts_short']} prompts received fewer)")
    n = c.get("n_sets", 0)
    per_cell = (f"{found['share'] / found['size']:.2%} vs {r['controls_share_per_cell']:.2%}"
                if r.get("controls_share_per_cell") is not None else "")
    return (_esc(entry["direction"]), _esc(entry["template"]), which, str(found["size"]),
            _pct(found.get("heldout_share")), _controls_cell(r.get("heldout") or {}, n),
            _controls_cell(m.get("heldout") or {}, n),
            _pct(found["share"]), "yes" if found["reached"] else '<span class="warn">no</span>',
            _controls_cell(r, n), _controls_cell(m, n), per_cell, "<br>".join(notes), received)


def _null_table(summary: pd.DataFrame) -> str:
    """``stability_null.csv``: seed pairs against seed-vs-null pairs, per template and direction."""
    summary = summary[summary["n_null_pairs"] > 0]
    if summary.empty:
        return ""
    def f(v: float, spec: str) -> str:
        return "-" if pd.isna(v) else format(v, spec)

    rows = [(r["template"], r["direction"], f"{r['n_sft_pairs']} / {r['n_null_pairs']}",
             f"{f(r['sft_spearman_mean'], '.3f')} / {f(r['null_spearman_mean'], '.3f')}",
             f"{f(r['sft_overlap_mean'], '.2f')} / {f(r['null_overlap_mean'], '.2f')}", f(r["separation_p"], ".3g"),
             r["verdict"] if r["n_sft_pairs"] else f"{r['verdict']}: no pair of SFT models (one training seed)")
            for _, r in summary.iterrows()]
    return ("<p><b>Seeds against a null</b> (<code>stability_null.csv</code>): <i>exceeds</i> only where every "
            "pair of SFT models is above every SFT-vs-null pair on both measures, and a permutation test over the "
            "models' labels (every choice of which models are the seeds; <i>separation p</i>, least value "
            "1 / C(seeds + nulls, seeds)) gives p &le; 0.05; <i>undecided</i> with too few models, and then it "
            "says how many seeds could reach 0.05.</p>"
            + html_table(("template", "direction", "pairs: seeds / vs null", "Spearman, coarse: seeds / vs null",
                          "top-k overlap: seeds / vs null", "separation p", "verdict"), rows))


def _stability_section(run_dir: Path, cells: pd.DataFrame, out: Path) -> str:
    """``stability.csv`` as a table and a bar figure (computed from the cells where a run made
    before it existed lacks the file)."""
    path = run_dir / "stability.csv"
    nulls = (RunFolder(run_dir).read(LocalizeManifest) or LocalizeManifest()).null_models
    table = pd.read_csv(path) if path.is_file() else stability_table(cells, nulls=nulls)
    intro = ("<h2>Stability</h2><p>Do two maps put the behaviour in the same place? Each row compares two maps of "
             "one graft direction: two SFT models on one template (<i>sft</i>), an SFT model and a null model "
             "(<i>sft_vs_null</i>: a finetune without the prompts' facts), two null models (<i>null_vs_null</i>), or two "
             "templates of one model (<i>template</i>). <b>Spearman, coarse</b>: rank correlation of the maps grouped by (span, layer "
             "quarter, component) (a span's tokens, the words after it as <i>span+</i>, <i>last</i>, tokens before "
             "any span as <i>other</i>), each group valued by the sum of |effect| of its cells over the template's "
             "prompts, divided by the prompts (magnitudes: opposite cells of a group do not cancel); a group one "
             "map lacks counts 0. <b>Top-k overlap</b>: the share of the k = 50 largest cells (by the same "
             "|effect| per (position label, slot)) the two maps have in common. Values: exact effects where every "
             "cell of both maps has one, else the estimate (column <i>value</i>). Written to "
             "<code>stability.csv</code>.</p>")
    if table.empty:
        return intro + "<p>Nothing to compare: the run maps one SFT model and one template.</p>"
    figs.stability(table, out / "stability.png")
    rows = [(r["kind"], r["direction"], figs.stability_label(r), r["value"], f"{r['n_prompts_a']} / {r['n_prompts_b']}",
             str(r["n_bins"]), f"{r['spearman_coarse']:.3f}", f"{r['top_overlap']:.2f} (k={r['top_k']})")
            for _, r in table[STABILITY_COLUMNS].iterrows()]
    summary = [(kind, direction, str(len(g)), f"{g['spearman_coarse'].mean():.3f} ({g['spearman_coarse'].min():.3f} to "
                f"{g['spearman_coarse'].max():.3f})", f"{g['top_overlap'].mean():.2f} ({g['top_overlap'].min():.2f} to "
                f"{g['top_overlap'].max():.2f})") for (kind, direction), g in table.groupby(["kind", "direction"], sort=False)]
    return (intro + html_table(("kind", "direction", "pairs", "Spearman, coarse: mean (min to max)",
                                "top-k overlap: mean (min to max)"), summary) + _null_table(null_summary(table))
            + html_table(("kind", "direction", "maps compared", "value", "prompts", "coarse groups",
                          "Spearman, coarse", "top-k overlap"), rows)
            + _img(out / "stability.png", "Spearman of coarse maps and top-k overlap per compared pair"))


def _claims_section(run_dir: Path) -> str:
    """``claims.csv``: the paper's claims as exact region grafts, judged across prompts against
    their null (a run made before them, or with ``claims: {enabled: false}``, has none)."""

    path = run_dir / "claims.csv"
    table = pd.read_csv(path, keep_default_na=False, na_values=[""]) if path.is_file() else pd.DataFrame()
    if table.empty or "null_kind" not in table:
        return ("<h2>The paper's claims</h2><p>No claims judged across prompts in this run (<code>claims.csv</code> is "
                "missing or from an earlier version); run localize again to write them.</p>")
    family = int(table["family_size"].max()) if "family_size" in table else 0
    least = table["least_p"] if "least_p" in table else pd.Series(float("nan"), index=table.index)
    reach = (f" (least reachable adjusted p: {min(1.0, family * least.max()):.2g})" if least.notna().any() else "")
    intro = ("<h2>The paper's claims</h2><p>Each claim grafts its whole region exactly in every prompt. The share is "
             "a ratio of sums over prompts of the region graft's effect and the effect of the cells it is a share of "
             "(<i>within</i>), in the claims' metric (by default <code>fact_logprob</code>: the answer against the "
             "world's other answers, so a donor that raises every answer alike has no effect), with its per-row "
             "interval at the level printed beside it (95%: Fieller's bounds at 99.99999%, the width that keeps 95% "
             "on every design of docs/statistics.md; declined, with the reason, where the within effect is not told "
             "from 0 at that level). A row's p is the largest of its parts: the threshold test "
             "(twice its one-sided p, so a row that holds has its interval on the claim's side), the region against "
             "its null across prompts (sign flips of the per-prompt differences, and relabelings of the region among "
             "its null draws within each prompt; the larger p) and, for a fact claim where the run has a control "
             f"finetune, the region against the control's same region; Holm-adjusted once over all {family} judged "
             f"rows of this run{reach}. "
             f"<i>holds</i>: Holm p &le; {ALPHA:g}; <i>fails</i>: "
             "the interval on the other side; else <i>undecided</i> (the reason is given); <i>no effect</i>: within's "
             f"interval includes 0 or its effect is below {FLOOR:.0%} of the whole donor-base gap; <i>precondition not "
             "met</i>: the setting's donor does not know the facts. Rows on null finetunes (<i>null finetune</i>) must "
             "hold nothing. Per-prompt effects: <code>claims_prompts.parquet</code>.</p>"
             + html_table(("claim", "statement", "test", "null", "paper's setting"),
                          [(c.name, c.statement, "shown" if not c.judged else f"share {'>' if c.above else '<'} "
                            f"{c.threshold:g}", NULL_KINDS[c.null], c.paper_setting) for c in CLAIMS]))
    keys = [k for k in ("model",) if k in table and table[k].nunique() > 1] + ["setting", "direction", "template"]

    def f(v: float) -> str:
        return "-" if pd.isna(v) else f"{v:.2f}"

    def text(v: object) -> str:
        return "" if pd.isna(v) else str(v)

    rows = []
    for _, r in table.iterrows():
        floor = min(1.0, family * least[r.name])  # the row's least p, Holm-adjusted at the family's size
        # a claims.csv written before ci_level was kept: "level not recorded", not an assumed 95%
        interval = share_text(r["share_exact"], r["ci_low"], r["ci_high"], r.get("ci_level"))
        rows.append((*[str(r[k]) for k in keys], r["claim"], interval,
                     "-" if pd.isna(r["threshold"]) else f"{r['side']} {r['threshold']:g}", f(r["null_mean"]),
                     f"{text(r.get('p_parts'))} / {p_text(r['p_holm'], floor)}",
                     r["verdict"], text(r.get("reason")), f"{int(r['n_prompts'])} ({text(r.get('evidence'))})",
                     f(r["share_estimate"]), text(r.get("note"))))
    return intro + html_table((*keys, "claim", "exact share [interval] (its level)", "test", "null mean (share)", "parts of p / Holm p",
                               "verdict", "why", "prompts", "estimate share", "note"), rows) + _steps_section(run_dir)


def _steps_section(run_dir: Path) -> str:
    """``claims_steps.csv``: where the SFT models are snapshots of one finetune, each claim's
    verdicts by step and the step from which it holds at every later step."""
    path = run_dir / "claims_steps.csv"
    if not path.is_file():
        return ""
    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    rows = [(r["setting"], r["direction"], r["template"], r["claim"], first_held_text(r), verdicts_text(r))
            for _, r in table.iterrows()]
    return ("<h3>The claims along the training steps</h3><p>The SFT models are snapshots of one finetune. A claim's "
            "first held step is the earliest saved step from which it holds at every later saved step; it began to "
            "hold after the saved step before it. Every verdict is one Holm family's, so a claim is said to hold at a "
            "step where it does not in at most 5% of runs.</p>"
            + html_table(("setting", "direction", "template", "claim", "first held [share, interval (its level)]",
                          "verdict by step"), rows))


def _sets_section(search: SearchRecord) -> str:
    header = ("direction", "template", "set", "cells", "held-out share", "held-out: random controls mean / p95, p",
              "held-out: matched controls mean / p95, p", "fit share", "fit target met",
              "fit: random controls mean / p95, p", "fit: matched controls mean / p95, p",
              "share per cell: set vs random controls (fit)", "notes", "cells each prompt received")
    rows = []
    for e in search.searches:
        rows.append(_set_row(e, "ranking", e))
        if e.get("refined"):
            rows.append(_set_row(e, "refined", e["refined"]))
    n = next((e["controls"]["n_sets"] for e in search.searches if e.get("controls")), 0)
    splits = search.splits
    split_note = ("; ".join(f"{_esc(t)}: {len(s['fit_ids'])} fit, {len(s['heldout_ids'])} held out"
                            for t, s in splits.items()) if splits else
                  '<span class="warn">no split: the sets were searched and judged on the same prompts</span>')
    parts = ["<h2>Found sets</h2>",
             f"<p>Every share is an exact graft in the metric <b>{_esc(describe(search.metric or 'first_logprob', localize=True))}</b> "
             "(share of the donor's total effect over a template's prompts). Each template's prompts are split "
             f"(seeded; <code>splits</code> in search.json): {split_note}. The sets are searched and refined on the "
             "fit prompts; the held-out prompts, which the search never saw, come first. <i>ranking</i>: the "
             "smallest prefix of the attribution ranking that carries the target on the fit prompts; <i>refined</i>: "
             f"that set shrunk by exact marginal gain. Controls: {n} random sets of the same size and {n} matched to "
             "the set's mix of (position label, component), all drawn outside the set (no control holds a cell of "
             "it); p = (1 + #controls with at least the set's share) / (1 + n). Seeds and cells are in search.json."
             "</p>", html_table(header, rows, raw=True)]
    if search.model:
        parts.insert(2, f"<p>Searched for the SFT model <b>{_esc(search.model)}</b> only (the first in the "
                        "config's list: each search costs minutes on a real pair); the other SFT models have maps.</p>")
    missed = [e for e in search.searches if e.get("missed")]
    if missed:
        mrows = []
        for e in missed:
            m = e["missed"]
            big = m.get("largest") or {}
            mrows.append((e["direction"], e["template"], str(m["k"]),
                          f"{m['sample_size']} of {m['n_below']} ({m.get('sampling', 'uniform')})",
                          " / ".join(big.get("cell", [])) or "-",
                          f"{big.get('effect', 0):.3g} ({_pct(big.get('share_of_total'))} of total)" if big else "-",
                          f"{_pct(m['share_below_k'])} [{_pct(m['ci95'][0])}, {_pct(m['ci95'][1])}]",
                          "; ".join(x["statement"] for x in m.get("rules_out", [])) or "-",
                          f"{m['above_sample_size']} of {m['n_above']}" + (" (sampled)" if m.get("above_sampled") else " (all)")))
        parts += ["<h3>What the ranking missed: an estimate</h3>",
                  "<p>Exact single-cell effects of a sample of the fit prompts' cells below the ranking's cut k, "
                  "stratified by rank; the share of the total |effect| that lies below k is estimated from the samples "
                  "(95% bootstrap interval within strata), and each threshold's one-sided 95% Clopper-Pearson bound "
                  "says what the sample rules out: a sample of n with no cell above a threshold rules out a fraction "
                  "of about 3/n or more, not rare large cells.</p>",
                  html_table(("direction", "template", "k", "sample below k", "largest sampled cell", "its effect",
                              "share of |effect| below k", "rules out (95%)", "cells above k measured"), mrows)]
    for e in search.searches:
        chosen = e.get("refined") or e
        label = "refined" if e.get("refined") else "ranking"
        cells = ", ".join(f"{c['position_label']}:{c['slot']}" for c in chosen["cells"])
        short = (chosen.get("received") or {}).get("short") or {}
        extra = ("<p>prompts that received fewer cells: " + _esc(", ".join(f"{k} ({v})" for k, v in short.items()))
                 + "</p>") if short else ""
        parts.append(f"<details><summary>{_esc(e['direction'])} / {_esc(e['template'])}: the {label} set "
                     f"({chosen['size']} cells)</summary><p><code>{_esc(cells)}</code></p>{extra}</details>")
    return "\n".join(parts)


def _units_section(unit_rows: pd.DataFrame, manifest: LocalizeManifest) -> str:
    """The strongest heads or neurons: mean estimate (and exact effect where computed) per
    (direction, template, position label, unit cell), the 20 largest by |mean estimate|."""

    config = manifest.config
    kind = Units(config["units"]) if config.get("units") else "head | neuron"  # a manifest before units
    frame = unit_rows.assign(cell=[cell_name(s, int(u)) for s, u in zip(unit_rows["slot"], unit_rows["unit"])])
    keys = [k for k in ("model", "direction", "template") if k in frame] + ["position_label", "cell", "unit"]
    table = frame.groupby(keys, sort=False).agg(prompts=("estimate", "size"), estimate=("estimate", "mean"),
                                                exact=("exact", "mean")).reset_index()
    table = table.loc[table["estimate"].abs().nlargest(20).index]
    note = (f"<p><code>units: {_esc(kind)}</code>: q/k/v/o split by attention head (a k/v head under grouped-query "
            "attention is one shared key/value head, serving its group of q heads) or gate/up/down by MLP neuron; "
            "<code>unit</code> -2 is o's or down's bias, which belongs to no unit. Per prompt only its "
            f"{_esc(config.get('unit_rows', ''))} unit cells of largest |estimate| are stored, and exact effects "
            f"only for each exact prompt's top {_esc(config.get('exact_units', ''))}: <em>prompts</em> counts the "
            "prompts whose stored rows hold the cell, and the means are over them. The cell maps above sum each "
            "split slot's units back into its cell.</p>")
    return "<h2>Heads and neurons</h2>" + note + table.to_html(index=False, float_format="%.4f", na_rep="")


def write_localize_report(run_dir: Path) -> Path:
    """Draw every figure of a localize run and write ``report/index.html``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    cells = pd.read_parquet(run_dir / "cells.parquet")
    unit_rows = cells[cells["unit"] != -1] if "unit" in cells else cells.iloc[:0]
    if "unit" in cells:  # the maps, stability and agreement are of whole cells (a split slot's: its units summed)
        cells = cells[cells["unit"] == -1]
    manifest = RunFolder(run_dir).read(LocalizeManifest) or LocalizeManifest()
    search = RunFolder(run_dir).read(SearchRecord) or SearchRecord()
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    name = manifest.config.get("name", run_dir.name)
    parts = [f"<h1>weightgraft localize: {_esc(name)}</h1>", _header(run_dir, manifest, cells),
             "<h2>Cell maps</h2><p>Mean effect per cell over the template's prompts (exact where every cell was "
             "computed exactly, else the gradient estimate); sufficiency grafts SFT's cell into PRE, necessity "
             "PRE's cell into SFT. Global slots (embed at every position, final_norm and unembed at the last) "
             "have a colour scale of their own (the unembedding can be 10-100x any layer cell); layer cells "
             "share one.</p>"]
    if "model" not in cells:  # a run made before several SFT models were possible
        cells = cells.assign(model="sft")
    several = cells["model"].nunique() > 1
    for (model, direction, template), sub in cells.groupby(["model", "direction", "template"], sort=False):
        column = value_column(sub)
        name = f"{model} / {direction} / {template}" if several else f"{direction} / {template}"
        if column is None:
            parts.append(f"<h3>{_esc(name)}</h3><p>No map: the run took no gradient estimates (<code>estimates: "
                         "false</code>) and mapped none of these prompts exactly (<code>exact</code>).</p>")
            continue
        stem = f"{model}_{direction}_{template}".replace("[", "").replace("]", "") if several else f"{direction}_{template}"
        figs.heatmaps(sub, column, f"{name}: mean {column} per cell", out / f"heatmap_{stem}.png")
        figs.last_token(sub, column, f"{name}: last token, mean {column}", out / f"last_{stem}.png")
        parts.append(f"<h3>{_esc(name)} ({_esc(column)})</h3>"
                     + _img(out / f"heatmap_{stem}.png", f"{name}: position x layer per component")
                     + _img(out / f"last_{stem}.png", f"{name}: the last token"))
    parts.append(_stability_section(run_dir, cells, out))
    parts.append(_claims_section(run_dir))
    title = str(manifest.config.get("name", run_dir.name))
    write_claims_markdown(run_dir, out, title)  # report/claims.md, for the docs
    if len(unit_rows):
        parts.append(_units_section(unit_rows, manifest))
    if not cells["estimate"].notna().any():  # estimates: false: nothing to set against the exact effects
        parts.append("<h2>Estimates against exact effects</h2><p>Not drawn: the run took no gradient estimates "
                     "(<code>estimates: false</code>).</p>")
    elif cells["exact"].notna().any():
        n_layers = int(cells["layer"].max()) + 1
        table = pd.concat([agreement(sub, n_layers).assign(model=model) for model, sub in cells.groupby("model", sort=False)],
                          ignore_index=True)
        table = table[["model", *[c for c in table.columns if c != "model"]]] if several else table.drop(columns="model")
        atomic.write_text(out / "agreement.csv", table.to_csv(index=False))
        figs.scatter(cells, out / "scatter.png")
        parts.append("<h2>Estimates against exact effects</h2>" + table.to_html(index=False, float_format="%.3f")
                     + _img(out / "scatter.png", "estimate vs exact effect per cell"))
    if search.searches:
        figs.curves(search, out / "recovery.png")
        parts.append(_sets_section(search) + _img(out / "recovery.png", "exact share against cells grafted"))
    page = out / "index.html"
    body = "\n".join(parts)
    atomic.write_text(page, f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>weightgraft localize: '
                      f"{_esc(name)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n")
    return page
