"""``stability.csv``: do two maps put the finetuned behaviour in the same place? Rows compare
every pair of SFT models (training seeds; per template and graft direction) and every pair of
templates (per SFT model and direction).

Coarse map: cells grouped by (span, layer quarter, component): the span from the position
label (``span_group``: the tokens of a span, ``first_entity-2`` -> ``first_entity``; the
template words after a span apart from it, ``first_entity+3`` -> ``first_entity+``; ``last``;
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
one, else the attribution estimate (integrated gradients where the run computed them).
"""

from __future__ import annotations

import re
from itertools import combinations

import pandas as pd

from weightgraft.localization.agreement import spearman

TOP_K = 50
COLUMNS = ["kind", "direction", "model_a", "template_a", "model_b", "template_b", "value", "n_prompts_a",
           "n_prompts_b", "n_bins", "spearman_coarse", "top_k", "top_overlap"]
CELL_KEY = ["position_label", "slot"]
UNIT_COLUMNS = ("unit",)  # a head or neuron index where the run split cells by unit


def span_group(label: str) -> str:
    """``first_entity-2`` / ``first_entity`` -> ``first_entity``; ``first_entity+3`` ->
    ``first_entity+`` (the words after the entity are not the entity); ``tok3`` -> ``other``;
    a repeated label's ``#2`` dropped."""
    label = re.sub(r"#\d+$", "", label)
    if re.fullmatch(r"tok\d+", label):
        return "other"
    m = re.fullmatch(r"(.+)([-+])\d+", label)
    if m is None:
        return label
    return m.group(1) + "+" if m.group(2) == "+" else m.group(1)


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
    ca, cb = coarse_map(a, column, n_layers), coarse_map(b, column, n_layers)
    bins = ca.index.union(cb.index)
    va, vb = cell_values(a, column), cell_values(b, column)
    kk = min(k, len(va), len(vb))
    overlap = len(top_cells(va, kk) & top_cells(vb, kk)) / kk if kk else float("nan")
    return {"value": column, "n_prompts_a": int(a["example_id"].nunique()), "n_prompts_b": int(b["example_id"].nunique()),
            "n_bins": len(bins), "spearman_coarse": spearman(ca.reindex(bins, fill_value=0.0), cb.reindex(bins, fill_value=0.0)),
            "top_k": kk, "top_overlap": overlap}


def stability_table(cells: pd.DataFrame, k: int = TOP_K) -> pd.DataFrame:
    """Every pair of SFT models (per template, direction) and of templates (per SFT model,
    direction), in the order the run lists them; ``cells`` as ``cells.parquet`` holds them."""
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
                    rows.append({"kind": "sft", "direction": direction, "model_a": ma, "template_a": template,
                                 "model_b": mb, "template_b": template, **compare(a, b, n_layers, k)})
        for model in models:
            for ta, tb in combinations(templates, 2):
                a, b = groups.get((model, ta, direction)), groups.get((model, tb, direction))
                if a is not None and b is not None:
                    rows.append({"kind": "template", "direction": direction, "model_a": model, "template_a": ta,
                                 "model_b": model, "template_b": tb, **compare(a, b, n_layers, k)})
    return pd.DataFrame(rows, columns=COLUMNS)
