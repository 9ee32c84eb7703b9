"""``stability.csv``: do two maps put the finetuned behaviour in the same place? Rows compare
every pair of mapped models per template and graft direction (``kind``: ``sft`` for two SFT
models, i.e. training seeds; ``sft_vs_null`` for an SFT model and a null model, a finetune
without the prompts' facts; ``null_vs_null`` for two null models) and every pair of templates (per
model and direction; ``template``).

Coarse map: cells grouped by (span, layer quarter, component): the span from the position
label (``span_group``: the tokens of a span, ``first_entity_last-2`` -> ``first_entity``; the
template words after a span apart from it, ``first_entity_last+3`` -> ``first_entity+``; ``last``;
tokens before any span -> ``other``), the layer quarter ``layer * 4 // n_layers`` (-1 for
embed / final_norm / unembed), the component as in ``cells.parquet``. A bin's
value is the sum of |effect| of its cells over the template's prompts, divided by the number of
prompts (the effect mass a prompt carries there on average). Magnitude, not the signed mean: a
location matters when grafting it moves the metric either way, and a signed sum would let a
strong positive and a strong negative cell of one bin cancel into an "empty" bin.

Top cells: cells keyed by (position label, slot), valued the same way (sum of |effect| over
the prompts / prompts); ``top_overlap`` = |top-k of A & top-k of B| / k with k = 50 (fewer only
where a map has fewer cells). Spearman is over the union of both maps' bins, a bin one map
lacks counting 0 (no cell, no effect). Values: exact effects where every cell of both maps has
one, else the attribution estimate (integrated gradients where the run computed them); a run
without estimates (``estimates: false``) whose maps are not all exact has none: ``value`` is
``none`` and the measures NaN (never a comparison of empty maps).

``stability_null.csv`` (``null_summary``): do the SFT models agree with each other more than
with a null model? Seeds share initialization, data and recipe, and the gradient estimates are
taken on PRE, so a high seed-vs-seed Spearman alone may reflect architecture and recipe rather
than where the facts sit; per template and direction, the ``sft`` rows are set against the
``sft_vs_null`` rows, by a permutation test over the models' labels (not over pairs: pairs that
share a model are not exchangeable), whose least p is ``1 / C(seeds + nulls, seeds)``.

Both files are a keyed stage of the run's folder (:func:`stability_stage`): keyed by the maps they
compare and the null models' labels, a resumed run that maps nothing new keeps them; an appended
model or a raised ``exact`` (other maps) computes them again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import combinations
from math import comb

import pandas as pd

from weightgraft import atomic
from weightgraft.localization.agreement import spearman
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.stages import FolderStage, frame_digest
from weightgraft.schemes.labels import label_group
from weightgraft.stats import model_label_p, models_needed

TOP_K = 50
ALPHA = 0.05  # the largest separation_p at which seed stability "exceeds" the null
MEASURES = {"spearman": "spearman_coarse", "overlap": "top_overlap"}
NULL_COLUMNS = ["template", "direction", "n_sft_pairs", "n_null_pairs", "sft_spearman_mean", "null_spearman_mean",
                "sft_spearman_min", "null_spearman_max", "sft_overlap_mean", "null_overlap_mean", "sft_overlap_min",
                "null_overlap_max", "separation_p", "verdict"]
COLUMNS = ["kind", "direction", "model_a", "template_a", "model_b", "template_b", "value", "n_prompts_a",
           "n_prompts_b", "n_bins", "spearman_coarse", "top_k", "top_overlap"]
CELL_KEY = ["position_label", "slot"]
FILES = ("stability.csv", "stability_null.csv")
NO_VALUE = "none"  # a pair whose maps have no value to compare (no estimates, not every cell exact): NaN measures
UNIT_COLUMNS = ("unit",)  # a head or neuron index where the run split cells by unit


def span_group(label: str) -> str:
    """``first_entity_last-2`` / ``first_entity_last`` -> ``first_entity``; ``first_entity_last+3``
    -> ``first_entity+`` (the words after the entity are not the entity); ``tok3`` -> ``other``;
    a repeated label's ``#2`` dropped. Labels of maps stored before ``_last`` (``first_entity-2``)
    group the same way."""
    span, after = label_group(label)
    return span + "+" if after else span


def cell_key(cells: pd.DataFrame) -> list[str]:
    """The columns that name one cell of a template's map (across its prompts)."""
    return CELL_KEY + [c for c in UNIT_COLUMNS if c in cells]


def value_for(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """``exact`` where every cell of both maps has an exact effect, else the estimate."""
    if "exact" in a and "exact" in b and a["exact"].notna().all() and b["exact"].notna().all():
        return "exact"
    both = pd.concat([a, b])
    if "estimate_ig" in both and both["estimate_ig"].notna().all():
        return "estimate_ig"
    return "estimate"


def coarse_map(cells: pd.DataFrame, column: str, n_layers: int) -> pd.Series:
    """(span, layer quarter, component) -> sum of |``column``| over the prompts' cells / prompts."""
    layer = cells["layer"].astype("float")
    keys = pd.DataFrame({"span": cells["position_label"].map(span_group),
                         "quarter": (layer * 4 // max(n_layers, 1)).fillna(-1).astype(int),
                         "component": cells["component"]})
    mass = cells[column].abs().groupby([keys["span"], keys["quarter"], keys["component"]]).sum()
    return mass / cells["example_id"].nunique()


def cell_values(cells: pd.DataFrame, column: str) -> pd.Series:
    """Cell key -> sum of |``column``| over the prompts / prompts."""
    return cells[column].abs().groupby([cells[c] for c in cell_key(cells)]).sum() / cells["example_id"].nunique()


def top_cells(values: pd.Series, k: int) -> set:
    """The ``k`` largest cells (ties broken by the key, so the set never depends on row order)."""
    frame = values.rename("v").reset_index()
    keys = [c for c in frame.columns if c != "v"]
    frame = frame.sort_values(["v", *keys], ascending=[False] + [True] * len(keys), kind="stable")
    return set(map(tuple, frame[keys].head(k).to_numpy().tolist()))


def compare(a: pd.DataFrame, b: pd.DataFrame, n_layers: int, k: int = TOP_K) -> dict[str, object]:
    """Spearman of two maps' coarse maps and the overlap of their top-k cells."""
    column = value_for(a, b)
    counts = {"n_prompts_a": int(a["example_id"].nunique()), "n_prompts_b": int(b["example_id"].nunique())}
    if a[column].isna().all() or b[column].isna().all():  # estimates: false without every exact map: no value
        return {"value": NO_VALUE, **counts, "n_bins": 0, "spearman_coarse": float("nan"), "top_k": 0,
                "top_overlap": float("nan")}
    ca, cb = coarse_map(a, column, n_layers), coarse_map(b, column, n_layers)
    bins = ca.index.union(cb.index)
    va, vb = cell_values(a, column), cell_values(b, column)
    kk = min(k, len(va), len(vb))
    overlap = len(top_cells(va, kk) & top_cells(vb, kk)) / kk if kk else float("nan")
    return {"value": column, **counts,
            "n_bins": len(bins), "spearman_coarse": spearman(ca.reindex(bins, fill_value=0.0), cb.reindex(bins, fill_value=0.0)),
            "top_k": kk, "top_overlap": overlap}


def pair_kind(model_a: str, model_b: str, nulls: Collection[str]) -> str:
    """``sft`` (two SFT models), ``sft_vs_null`` or ``null_vs_null`` (two null models; not ``null``,
    which CSV readers take for a missing value)."""
    n = (model_a in nulls) + (model_b in nulls)
    return ("sft", "sft_vs_null", "null_vs_null")[n]


def stability_table(cells: pd.DataFrame, k: int = TOP_K, nulls: Collection[str] = ()) -> pd.DataFrame:
    """Every pair of mapped models (per template, direction) and of templates (per model,
    direction), in the order the run lists them; ``cells`` as ``cells.parquet`` holds them;
    ``nulls``: the labels of the null models."""
    if "model" not in cells:
        cells = cells.assign(model="sft")
    keys = ["model", "template", "direction", "example_id", "position", *cell_key(cells)]
    if cells.duplicated(keys).any():  # rows finer than the key (units under another name): never summed blindly
        raise ValueError(f"stability: cells.parquet holds several rows per cell {keys}; a unit column must be "
                         f"named in weightgraft.localization.stability.UNIT_COLUMNS")
    n_layers = int(cells["layer"].max()) + 1 if cells["layer"].notna().any() else 1
    models = list(dict.fromkeys(cells["model"]))
    templates = list(dict.fromkeys(cells["template"]))
    groups = {key: g for key, g in cells.groupby(["model", "template", "direction"], sort=False)}
    rows = []
    for direction in dict.fromkeys(cells["direction"]):
        for template in templates:
            for ma, mb in combinations(models, 2):
                a, b = groups.get((ma, template, direction)), groups.get((mb, template, direction))
                if a is not None and b is not None:
                    rows.append({"kind": pair_kind(ma, mb, nulls), "direction": direction, "model_a": ma, "template_a": template,
                                 "model_b": mb, "template_b": template, **compare(a, b, n_layers, k)})
        for model in models:
            for ta, tb in combinations(templates, 2):
                a, b = groups.get((model, ta, direction)), groups.get((model, tb, direction))
                if a is not None and b is not None:
                    rows.append({"kind": "template", "direction": direction, "model_a": model, "template_a": ta,
                                 "model_b": model, "template_b": tb, **compare(a, b, n_layers, k)})
    return pd.DataFrame(rows, columns=COLUMNS)


def separation_p(pairs: pd.DataFrame, seeds: Sequence[str], nulls: Sequence[str]) -> float:
    """The permutation p over models (``weightgraft.stats.model_label_p``) that the seeds agree with
    each other more than with the nulls, on both measures (the larger p): every relabeling of the
    models as ``len(seeds)`` seeds, so its least value is ``1 / C(seeds + nulls, seeds)``."""
    values = []
    for column in MEASURES.values():
        sim = {(a, b): v for a, b, v in zip(pairs["model_a"], pairs["model_b"], pairs[column])}
        values.append(model_label_p(sim, list(seeds), list(nulls)))
    return max(values)


def null_verdict(sft: pd.DataFrame, null: pd.DataFrame, p: float, n_seeds: int, n_nulls: int) -> str:
    """``exceeds`` where every seed pair is above every seed-vs-null pair on both measures and the
    permutation p over models is <= ``ALPHA``; ``undecided`` with no seed pair, no null pair, a
    missing value, or too few models for the test to reach ``ALPHA`` (saying how many seeds would);
    else ``does not exceed``."""
    columns = list(MEASURES.values())
    if sft.empty or null.empty or sft[columns].isna().any().any() or null[columns].isna().any().any():
        return "undecided"
    if not all(sft[c].min() > null[c].max() for c in columns):
        return "does not exceed"
    if 1 / comb(n_seeds + n_nulls, n_seeds) > ALPHA:
        return (f"undecided: {n_seeds} seeds beside {n_nulls} null(s) cannot reach p <= {ALPHA} "
                f"(least p {1 / comb(n_seeds + n_nulls, n_seeds):.2g}; {models_needed(n_nulls, ALPHA)} seeds could)")
    return "exceeds" if p <= ALPHA else "undecided"


def null_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (template, direction) of ``stability.csv``'s model pairs: the seed pairs'
    mean Spearman and top-k overlap beside the seed-vs-null pairs', the permutation p over
    models and the verdict (a run without null models: ``n_null_pairs`` 0, ``undecided``)."""
    pairs = table[table["kind"].isin(["sft", "sft_vs_null", "null_vs_null"])]
    rows = []
    for (template, direction), g in pairs.groupby(["template_a", "direction"], sort=False):
        sft, null = g[g["kind"] == "sft"], g[g["kind"] == "sft_vs_null"]
        row: dict[str, object] = {"template": template, "direction": direction, "n_sft_pairs": len(sft),
                                  "n_null_pairs": len(null)}
        for name, column in MEASURES.items():
            row[f"sft_{name}_mean"] = sft[column].mean()
            row[f"null_{name}_mean"] = null[column].mean()
            row[f"sft_{name}_min"] = sft[column].min()
            row[f"null_{name}_max"] = null[column].max()
        seeds = list(dict.fromkeys([*sft["model_a"], *sft["model_b"], *null["model_a"]]))
        nulls = list(dict.fromkeys(null["model_b"]))
        row["separation_p"] = (separation_p(g, seeds, nulls) if len(sft) and len(null)
                               and not g[list(MEASURES.values())].isna().any().any() else float("nan"))
        row["verdict"] = null_verdict(sft, null, row["separation_p"], len(seeds), len(nulls))
        rows.append(row)
    return pd.DataFrame(rows, columns=NULL_COLUMNS)


def stability_stage(folder: RunFolder, cells: pd.DataFrame, nulls: Sequence[str]) -> bool:
    """``stability.csv`` and ``stability_null.csv`` of ``cells`` (whole cells, as ``cells.parquet``
    holds them) as a keyed stage of the run's folder: kept where the folder's ``stages.json``
    holds the key of these maps and nulls, else computed and written. Whether they were kept."""

    def make() -> None:
        table = stability_table(cells, nulls=nulls)
        atomic.write_text(folder.path / FILES[0], table.to_csv(index=False))
        atomic.write_text(folder.path / FILES[1], null_summary(table).to_csv(index=False))

    inputs = {"maps": frame_digest(cells), "nulls": list(nulls), "top_k": TOP_K, "alpha": ALPHA}
    _, kept = FolderStage(folder, "stability", inputs, FILES).run(make, lambda: None)
    return kept
