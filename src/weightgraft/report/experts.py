"""The report page of a ``weightgraft experts`` folder: which experts of a finetune move the
answer, read beside its control finetune's same cells and against the region grafts.

One page in the run and localize reports' look (``report/html.py``: its style and tables, figures
embedded, the PNG files beside the page): what a cell is, the layer x expert maps per template and
region (finetune and controls on one colour scale, pick rate as dot area), the region grafts
(sufficiency and necessity), the top cells with the controls' effect beside, the concentration
shares, and the manifest (models, hashes, versions, prompt counts). Every row is a measurement
with its interval; the page judges nothing.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft import atomic
from weightgraft.engine.metric_table import describe
from weightgraft.report.expert_figures import expert_heatmaps
from weightgraft.report.html import CSS, _esc, _hash_cell, html_table
from weightgraft.report.run import ReportError
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import EXPERTS_FORMAT, ExpertsManifest

__all__ = ["EXPERTS_FORMAT", "is_experts_folder", "write_experts_report"]

TABLES = ("experts.csv", "top_cells.csv", "concentration.csv", "regions.csv")
REGION_GRAFTS = ("experts", "router", "moe", "all")
REGION_NAMES = {"first_entity": "first entity (its tokens)", "last": "last token"}


def _manifest(folder: Path) -> ExpertsManifest:
    """The folder's expert-map manifest; an empty one where it holds none (or another kind's)."""
    try:
        return RunFolder(Path(folder)).read(ExpertsManifest) or ExpertsManifest()
    except ValueError:
        return ExpertsManifest()


def is_experts_folder(folder: Path) -> bool:
    """Whether ``folder`` was written by ``weightgraft experts`` (its manifest's format says so),
    so ``weightgraft report`` can tell it from a run folder."""
    return _manifest(folder).format == EXPERTS_FORMAT


def _read(folder: Path, name: str) -> pd.DataFrame:
    # text columns stay text: a model, template or reason called "NA" is not a missing value
    return pd.read_csv(folder / name, keep_default_na=False, na_values=[""],
                       dtype={c: str for c in ("model", "template", "region", "graft", "direction", "declined")})


def _num(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value):.3g}"


def _pct(value: Any) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{100 * float(value):.1f}%"


def _level_text(level: Any) -> str:
    return "level not recorded" if level is None or pd.isna(level) else f"{100 * float(level):g}%"


def interval_text(value: Any, low: Any, high: Any, level: Any, declined: Any = None, *, with_level: bool = True) -> str:
    """``mean [low, high] (95%)``; the reason where the interval was declined, so no mean is read
    as more certain than it is."""
    if pd.isna(low) or pd.isna(high):
        why = "" if declined is None or pd.isna(declined) or not str(declined) else f": {declined}"
        return f"{_num(value)} (no interval{why})"
    return f"{_num(value)} [{_num(low)}, {_num(high)}]" + (f" ({_level_text(level)})" if with_level else "")


def _levels(*frames: pd.DataFrame) -> str | None:
    """The one level every interval of ``frames`` has, for a column header; None where they differ."""
    found = {round(float(v), 6) for f in frames if "level" in f for v in f["level"].dropna()}
    return _level_text(found.pop()) if len(found) == 1 else None


def _img(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(caption)}">'
            f"<figcaption>{_esc(caption)} ({_esc(path.name)})</figcaption></figure>")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def _models(manifest: ExpertsManifest, summary: pd.DataFrame) -> list[str]:
    """The finetune first, then its controls: the manifest's donors in order, else the table's."""
    donors = list(manifest.donors)
    seen = list(dict.fromkeys(summary["model"]))
    return [m for m in donors if m in seen] + [m for m in seen if m not in donors]


def _cell_counts(folder: Path) -> str:
    """Per model, the picked cells run exactly and the unpicked ones listed as 0 (from
    ``expert_cells.parquet``; nothing where it is absent)."""
    path = folder / "expert_cells.parquet"
    if not path.is_file():
        return ""
    cells = pd.read_parquet(path, columns=["model", "picked"])
    counts = cells.groupby("model", sort=False)["picked"].agg(["sum", "size"])
    said = "; ".join(f"{_esc(m)}: {int(r['sum'])} picked cells run, {int(r['size'] - r['sum'])} unpicked listed as 0"
                     for m, r in counts.iterrows())
    return f"<p>Cells in <code>expert_cells.parquet</code>: {said}.</p>"


def _intro(folder: Path, manifest: ExpertsManifest, models: list[str]) -> str:
    metric = manifest.metric or "fact_logprob"
    finetune, controls = models[0], models[1:]
    donors = manifest.donors
    who = f"finetune <b>{_esc(finetune)}</b> <code>{_esc(donors.get(finetune, ''))}</code>"
    if controls:
        who += "; " + ", ".join(f"control <b>{_esc(c)}</b> <code>{_esc(donors.get(c, ''))}</code>" for c in controls)
    else:
        who += "; no control finetune was mapped"
    counts = manifest.n_prompts
    prompts = ", ".join(f"{_esc(t)}: {_esc(n)}" for t, n in counts.items()) or "n/a"
    return "\n".join([
        f'<p class="lead">weightgraft experts; base (PRE) <code>{_esc(manifest.pre)}</code>; {who}; '
        f"metric <b>{_esc(describe(metric))}</b>; {_esc(manifest.direction)} test prompts per template: "
        f'{prompts}; <a href="#manifest">manifest</a> (hashes, versions) at the end</p>',
        "<p><b>A cell</b> is one expert of one layer of the finetune grafted alone into PRE at one of the "
        "region's tokens, everything else PRE's: its effect is exact (the model's own forward with that expert's "
        "weights swapped in, no estimate). A region's effect per prompt is the sum of its cells over the region's "
        "tokens (the first entity's tokens, or the last token); the tables and maps show the mean over prompts "
        "with its t interval. The <b>pick rate</b> is the share of the region's tokens where PRE's router picks "
        "the expert.</p>",
        "<p><b>Unpicked cells are exact zeros, measured, not estimated.</b> Grafting an expert the router does not "
        "pick changes only that layer's output at that token, where the router does not read it, so the cell moves "
        "nothing; such cells are listed with effect 0 and not run. In every map a few of them (seeded) are run "
        "anyway by the per-token procedure and must leave the logits bit for bit, or the map stops.</p>",
        _cell_counts(folder),
    ])


def _maps_section(summary: pd.DataFrame, models: list[str], out: Path, metric: str) -> str:
    parts = ["<h2>Expert maps</h2>",
             "<p>Per template and region: layer x expert, colour the mean effect of the cell (sufficiency: one "
             "expert of the model into PRE), dot area its pick rate; "
             + ("each control's map beside the finetune's, on the same colour scale. " if len(models) > 1 else "")
             + "A cell with no dot is never picked there: its effect is an exact 0. Grey: no such cell.</p>"]
    for (template, region), sub in summary.groupby(["template", "region"], sort=False):
        name = f"{template} · {REGION_NAMES.get(str(region), region)}"
        path = out / f"experts_{_slug(str(template))}_{_slug(str(region))}.png"
        drawn = expert_heatmaps(sub, models, f"{name}: mean effect per cell ({metric}); dot area = pick rate", path,
                                metric=metric)
        parts.append(f"<h3>{_esc(name)}</h3>" + _img(path, f"{name}: layer x expert, {' | '.join(drawn)}"))
    return "\n".join(parts)


def _regions_section(regions: pd.DataFrame, models: list[str]) -> str:
    level = _levels(regions)
    head = f"mean [{level} t interval]" if level else "mean [t interval] (its level)"
    order = {m: i for i, m in enumerate(models)}
    rows = []
    keys = ["direction", "template", "region", "model"]
    grouped = regions.assign(_m=regions["model"].map(order).fillna(len(order)))
    grouped = grouped.sort_values(["direction", "template", "region", "_m"], ascending=[False, True, True, True],
                                  kind="stable")
    for key, g in grouped.groupby(keys, sort=False):
        by = {str(r["graft"]): r for _, r in g.iterrows()}
        cells = [interval_text(r["effect"], r["ci_low"], r["ci_high"], r["level"], r.get("declined"), with_level=not level)
                 if (r := by.get(graft)) is not None else "-" for graft in REGION_GRAFTS]
        rows.append((*[str(k) for k in key], str(int(g["n_prompts"].max())), *cells))
    return ("<h2>Region grafts</h2><p>Every layer's component at the region's tokens grafted at once, exact: "
            "<i>experts</i> every expert bank, <i>router</i> the router alone, <i>moe</i> both, <i>all</i> every cell "
            "at the region's tokens (the embedding and every layer slot; at the last token the final norm and "
            "unembedding too). <i>sufficiency</i>: the model's components into PRE (the map's direction); "
            "<i>necessity</i>: PRE's components into the model, so a negative effect is what the model's answer "
            "loses. Each row is a mean over its prompts; no row is judged against a threshold or a null "
            "(<code>regions.csv</code>).</p>"
            + html_table(("direction", "template", "region", "model", "prompts",
                          *(f"{g}: {head}" for g in REGION_GRAFTS)), rows))


def _cell_text(r: pd.Series, suffix: str, declined: Any, with_level: bool) -> str:
    """A top cell's mean and interval; a cell never picked is said to be an exact 0, not ``0 [0, 0]``."""
    value = r[f"effect{suffix}"]
    rate = r.get(f"pick_rate{suffix}", r["pick_rate"])
    if not pd.isna(rate) and float(rate) == 0 and not pd.isna(value) and float(value) == 0:
        return "0 (never picked: exact)"
    return interval_text(value, r[f"ci_low{suffix}"], r[f"ci_high{suffix}"], r["level"], declined, with_level=with_level)


def _top_section(top: pd.DataFrame, summary: pd.DataFrame, controls: list[str]) -> str:
    level = _levels(top)
    head = f"mean [{level} t interval]" if level else "mean [t interval] (its level)"
    beside = [c for c in controls if f"effect[{c}]" in top]
    keys = ["model", "template", "region", "layer", "expert"]
    reasons = summary.set_index(keys)["declined"].to_dict() if "declined" in summary else {}
    rows = []
    for _, r in top.iterrows():
        where = (str(r["template"]), str(r["region"]), int(r["layer"]), int(r["expert"]))
        mine = _cell_text(r, "", r.get("declined"), not level)
        theirs = [_cell_text(r, f"[{c}]", reasons.get((c, *where)), not level) for c in beside]
        rows.append((str(r["template"]), str(r["region"]), str(int(r["layer"])), str(int(r["expert"])),
                     f"{float(r['pick_rate']):.2f}", mine, *theirs))
    model = str(top["model"].iloc[0]) if len(top) else "the finetune"
    note = (f"; beside it, each control's effect in the same cell ({', '.join(_esc(c) for c in beside)})" if beside
            else "; no control was mapped")
    return (f"<h2>Top cells</h2><p>{_esc(model)}'s cells of largest mean effect per template and region{note} "
            "(<code>top_cells.csv</code>). A control's interval is its own, at the same level.</p>"
            + html_table(("template", "region", "layer", "expert", "pick rate", f"{model}: {head}",
                          *(f"{c}: {head}" for c in beside)), rows))


def _concentration_section(conc: pd.DataFrame) -> str:
    shares = [c for c in conc.columns if c.startswith("top") and c.endswith("_share")]
    rows = [(str(r["model"]), str(r["template"]), str(r["region"]), str(int(r["cells"])), _num(r["total"]),
             *(_pct(r[c]) for c in shares)) for _, r in conc.iterrows()]
    return ("<h2>Concentration</h2><p>Per region, the share of the summed single-cell mean effects in the 1, 2, 4 "
            "and 8 cells of largest effect: descriptive, since single-cell effects need not add up to a joint "
            "graft's (the region grafts above are the joint ones), and a share passes 100% where other cells' effects "
            "are negative; n/a where the total is not positive "
            "(<code>concentration.csv</code>).</p>"
            + html_table(("model", "template", "region", "cells", "total", *(f"{c[:-6]} share" for c in shares)), rows))


def _manifest_section(folder: Path, manifest: ExpertsManifest) -> str:
    rows = [(_esc(role), _esc(info.spec), _esc(info.source), _hash_cell(info.weights_sha256))
            for role, info in manifest.models.items()]
    left_out = "n/a" if manifest.prompts_left_out is None else str(manifest.prompts_left_out)
    settings = [("folder", str(folder)), ("format", manifest.format),
                ("metric", describe(manifest.metric)), ("direction", manifest.direction),
                ("templates", ", ".join(manifest.templates)),
                ("prompts per template", ", ".join(f"{t}: {n}" for t, n in manifest.n_prompts.items())),
                ("prompt cap per template", str(manifest.prompts or "none")),
                ("prompts left out", left_out),
                ("data", manifest.data), ("seed", "" if manifest.seed is None else str(manifest.seed))]
    versions = manifest.versions
    parts = ['<section id="manifest" class="prov"><h2>Manifest</h2>']
    if rows:
        parts.append(html_table(("role", "spec", "source", "weights sha256"), rows, raw=True))
    parts.append(html_table(("setting", "value"), settings))
    if versions:
        parts.append(html_table(("package", "version"), [(k, v) for k, v in versions.items()]))
    parts.append(f"<details><summary>manifest.json</summary><pre>{_esc(json.dumps(manifest.as_json(), indent=2))}</pre>"
                 "</details></section>")
    return "\n".join(parts)


def write_experts_report(folder: Path, out: Path | None = None) -> Path:
    """Draw the expert maps of a ``weightgraft experts`` folder and write ``report/index.html``
    (``out``: another folder) beside its PNG figures; returns the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    folder = Path(folder)
    manifest = _manifest(folder)
    if manifest.format != EXPERTS_FORMAT:
        raise ReportError(f"{folder}: no {EXPERTS_FORMAT} manifest.json (is it a `weightgraft experts` folder?)")
    missing = [n for n in TABLES if not (folder / n).is_file()]
    if missing:
        raise ReportError(f"{folder}: {', '.join(missing)} missing; rerun `weightgraft experts` to write them")
    summary, top, conc, regions = (_read(folder, n) for n in TABLES)
    if summary.empty:
        raise ReportError(f"{folder / 'experts.csv'} holds no rows: nothing to report")
    models = _models(manifest, summary)
    metric = manifest.metric or "fact_logprob"
    out = Path(out) if out is not None else folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    title = f"weightgraft experts: {folder.name}"
    body = "\n".join([f"<h1>{_esc(title)}</h1>", _intro(folder, manifest, models),
                      _maps_section(summary, models, out, metric), _regions_section(regions, models),
                      _top_section(top, summary, models[1:]), _concentration_section(conc), _manifest_section(folder, manifest)])
    page = out / "index.html"
    atomic.write_text(page, f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                      f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                      f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n")
    return page
