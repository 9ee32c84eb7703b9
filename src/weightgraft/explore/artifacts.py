"""A run's and a localize run's outputs as the explore page shows them, read once when the app
starts from the directories named on the command line (the client never names a file: figures
are served by their index in the list read here)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.data.freeform import load_prompts
from weightgraft.report.run import ReportError, read_summary
from weightgraft.report.tables import table_header, table_rows
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import LocalizeManifest, SearchRecord, SweepManifest
from weightgraft.schemes.labels import LABEL_VERSION, upgrade_cells, upgrade_label

EXAMPLES_PER_TEMPLATE = 8
CONTROLS_SHOWN = 2  # control sets per kind offered on the page
GROUP_COLUMNS = ("model_set", "template", "direction")  # shown where the run has more than one value


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, numpy scalars plain numbers."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value



def _cell_keys(cells: Any) -> list[dict[str, str]]:
    """Cell keys as ``{position_label, slot}``, from either way search.json writes them."""
    out = []
    for c in cells or []:
        if isinstance(c, dict) and "position_label" in c and "slot" in c:
            out.append({"position_label": str(c["position_label"]), "slot": str(c["slot"])})
        elif isinstance(c, (list, tuple)) and len(c) == 2:
            out.append({"position_label": str(c[0]), "slot": str(c[1])})
    return out


def _unit_counts(cells: Sequence[dict[str, str]]) -> dict[str, int]:
    """How many keys of a set are heads, neurons and rests (``/bias``); ``{}`` for whole cells."""
    counts: dict[str, int] = {}
    for c in cells:
        _, _, unit = c["slot"].partition("/")
        if unit:
            kind = "rest" if unit == "bias" else "head" if unit[0] == "h" else "neuron"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def _find_data(data: str | None, where: Path) -> Path | None:
    """A manifest's dataset path: as written (absolute or from the working directory), else
    from the output directory or one of its parents (configs keep paths relative)."""
    if not data:
        return None
    path = Path(data)
    candidates = [path] if path.is_absolute() else [path, *(p / path for p in [where, *where.parents])]
    return next((c for c in candidates if c.exists()), None)


def _prompts_by_id(data: str | None, where: Path) -> dict[str, dict[str, Any]]:
    """Test prompts of the dataset a run used, by example id (spans included), or ``{}``."""

    found = _find_data(data, where)
    if found is None:
        return {}
    try:
        prompts = load_prompts(found)
    except (OSError, ValueError):
        return {}
    return {p.id: {"id": p.id, "template": p.template, "prompt": p.prompt, "answer": p.answer,
                   "spans": {k: list(v) for k, v in p.spans.items()}} for p in prompts}


def _examples(rows: Sequence[dict[str, Any]], known: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Up to ``EXAMPLES_PER_TEMPLATE`` examples per template, spans from the dataset if found."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        group = out.setdefault(row["template"], [])
        if len(group) < EXAMPLES_PER_TEMPLATE and all(e["id"] != row["id"] for e in group):
            group.append(known.get(row["id"], row))
    return out


def summary_table(summary: pd.DataFrame) -> tuple[list[str], list[dict[str, Any]]]:
    """The run's summary as ``weightgraft report`` tables it (the same cells, confidence
    intervals and notes, the whole-answer recovery among them), one page table for every
    (model set, template, direction). Rows carry their keys for the row click."""
    groups = [c for c in GROUP_COLUMNS if c in summary and (c == "template" or summary[c].nunique() > 1)]
    columns = [*groups, *table_header()]
    rows = []
    for record, cells in zip(summary.to_dict("records"), table_rows(summary), strict=True):
        shown = [str(record[c]) for c in groups] + list(cells)
        rows.append({"cells": shown, "scheme": str(record["scheme"]), "template": str(record["template"]),
                     "model_set": str(record.get("model_set", ""))})
    return columns, rows


class RunView:
    """``weightgraft run``'s directory: summary table, schemes, figures, example prompts."""

    def __init__(self, run_dir: Path) -> None:
        run_dir = Path(run_dir)
        summary = run_dir / "summary.csv"
        if not summary.is_file():
            raise ReportError(f"--run {run_dir}: no summary.csv there (is it a `weightgraft run` directory?)")
        manifest = RunFolder(run_dir).read(SweepManifest) or SweepManifest()
        self.name = run_dir.name
        self.protocol = manifest.protocol
        self.schemes = {s["name"]: s for s in manifest.schemes if "name" in s}
        self.columns, self.rows = summary_table(read_summary(summary))
        figures = run_dir / "report" / "figures"
        self.figures = sorted(figures.glob("*.png")) if figures.is_dir() else []
        results = run_dir / "results.parquet"
        rows: list[dict[str, Any]] = []
        if results.is_file():
            frame = pd.read_parquet(results, columns=["template", "example_id", "prompt", "answer"])
            frame = frame.drop_duplicates("example_id")
            rows = [{"id": r["example_id"], "template": r["template"], "prompt": r["prompt"],
                     "answer": r["answer"], "spans": {}} for r in frame.to_dict("records")]
        known = _prompts_by_id(manifest.config.get("data"), run_dir)
        self.examples = _examples(rows, known)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "protocol": self.protocol, "columns": self.columns, "rows": self.rows,
                "schemes": {k: {"name": v["name"], "base": v.get("base", "pre"), "rules": v.get("rules", [])}
                            for k, v in self.schemes.items()},
                "figures": [{"index": i, "name": p.stem} for i, p in enumerate(self.figures)],
                "examples": self.examples}

    def figure(self, index: int) -> Path:
        """The ``index``-th figure read at start (an index, never a client path)."""
        if not 0 <= index < len(self.figures):
            raise IndexError(index)
        return self.figures[index]


class LocalizeView:
    """``weightgraft localize``'s directory: cell maps averaged per (direction, template) by
    (position label, slot), so that they land on any prompt of the template through its
    labels; the minimal graft sets; example prompts."""

    def __init__(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        cells_path = out_dir / "cells.parquet"
        if not cells_path.is_file():
            raise ReportError(f"--localize {out_dir}: no cells.parquet there (is it a `weightgraft localize` directory?)")
        manifest = RunFolder(out_dir).read(LocalizeManifest) or LocalizeManifest()
        search = RunFolder(out_dir).read(SearchRecord) or SearchRecord()
        old_labels = manifest.labels < LABEL_VERSION  # a span's last token was named by the span
        search = SearchRecord.model_validate(upgrade_cells(search.as_json())) if old_labels else search
        self.name = out_dir.name
        self.metric = search.metric or manifest.config.get("metric", "")
        self.units = str(manifest.config.get("units") or "cell")
        self.searches = [self._search(s) for s in search.searches]
        cells = pd.read_parquet(cells_path)
        if old_labels:
            cells["position_label"] = cells["position_label"].map(upgrade_label)
        if "unit" in cells:  # heads / neurons: the page paints whole cells (a split slot's units summed)
            cells = cells[cells["unit"] == -1]
        # several SFT models (training seeds): the first one's maps, the model the found sets belong to
        self.models = list(dict.fromkeys(cells["model"])) if "model" in cells else []
        self.model = self.models[0] if self.models else "sft"
        if self.models:
            cells = cells[cells["model"] == self.model]
        self.columns = [c for c in ("estimate", "estimate_ig", "exact") if c in cells and cells[c].notna().any()]
        self.maps = []
        # no value to paint (estimates: false and no exact map): no map, rather than an empty one
        for (direction, template), group in cells.groupby(["direction", "template"], sort=False) if self.columns else []:
            mean = group.groupby(["position_label", "slot"], sort=False)[self.columns].mean()
            values = {c: [[label, slot, _clean(v)] for (label, slot), v in mean[c].items() if pd.notna(v)]
                      for c in self.columns}
            self.maps.append({"direction": direction, "template": template,
                              "n_examples": int(group["example_id"].nunique()), "values": values})
        ids = cells[["example_id", "template"]].drop_duplicates("example_id")
        known = _prompts_by_id(manifest.config.get("data"), out_dir)
        rows = [known[i] for i in ids["example_id"] if i in known]
        self.examples = _examples(rows, known)

    @staticmethod
    def _search(entry: dict[str, Any]) -> dict[str, Any]:
        """One search as the page's buttons: the found set, its exact refinement and the first
        control sets of each kind (random, matched) where the run wrote them."""
        keep = ("direction", "template", "n_examples", "target_share", "size", "share", "reached")
        out = {k: entry.get(k) for k in keep}
        out["cells"] = _cell_keys(entry.get("cells"))
        sets = [{"name": "minimal set", "share": entry.get("share"), "cells": out["cells"]}]
        refined = entry.get("refined")
        if isinstance(refined, dict) and refined.get("cells"):
            sets.append({"name": "refined set", "share": refined.get("share"), "cells": _cell_keys(refined["cells"])})
        controls = entry.get("controls")
        for kind in ("random", "matched"):
            drawn = controls.get(kind, {}).get("sets", []) if isinstance(controls, dict) else []
            for i, c in enumerate(drawn[:CONTROLS_SHOWN]):
                sets.append({"name": f"{kind} control #{i + 1}", "share": c.get("share"), "cells": _cell_keys(c.get("cells"))})
        # a set of heads or neurons (``layers.3.o/h2``) is applied unit by unit: the page says how many of each
        for s in sets:
            s["by_unit"] = _unit_counts(s["cells"])
        out["sets"] = [s for s in sets if s["cells"]]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "metric": self.metric, "units": self.units, "model": self.model, "models": self.models,
                "columns": self.columns, "maps": self.maps,
                "searches": self.searches, "examples": self.examples}
