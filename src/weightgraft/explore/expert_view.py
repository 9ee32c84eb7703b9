"""``weightgraft experts``' folder as the explore page shows it (``--experts DIR``): per model,
template, region, layer and expert, the mean exact effect with its interval and the pick rate, read
once from ``experts.csv`` when the app starts. A click on a cell grafts that expert of that layer
at that region's tokens (a ``wg.Rule`` with ``experts``), so the researcher sees the map's claim on
the prompt in front of them.

What a cell is, said on the page: the mean over the map's prompts of the region's summed
single-token effects of grafting the expert alone from the model into PRE (sufficiency), in the
map's metric; the click grafts the expert at all the region's tokens at once, on this prompt, so its
answer need not equal the mean (single-token effects need not add up, and one prompt is not the
mean). The map was computed on the models its manifest names: where explore's models of the same
roles have other weights (sha256), the page says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.engine.architectures import Slot
from weightgraft.engine.source_map import SlotName
from weightgraft.expert_maps.summary import REGIONS
from weightgraft.explore.artifacts import _clean, _examples, _prompts_by_id
from weightgraft.report.run import ReportError
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import EXPERTS_FORMAT, ExpertsManifest

FORMAT = EXPERTS_FORMAT
COLUMNS = ("layer", "expert", "effect", "ci_low", "ci_high", "declined", "pick_rate", "n_prompts")
# what a cell means, beside the map (the page shows it as written)
CELL_MEANING = ("a cell: the mean over the map's prompts of the region's summed exact effects of grafting this one "
                "expert of this layer from the model into PRE at one token at a time (sufficiency), with its "
                "interval; the dot: the share of the region's tokens where PRE's router picks it (never picked: "
                "an exact 0). A click grafts that expert at all the region's tokens at once on the prompt shown, "
                "which need not give the mean.")


class ExpertMapView:
    """An expert map folder (``manifest.json`` of format ``weightgraft.experts/1`` and
    ``experts.csv``), checked against the loaded models' banks by :meth:`check`."""

    def __init__(self, folder: Path) -> None:
        folder = Path(folder)
        table = folder / "experts.csv"
        try:
            manifest = RunFolder(folder).read(ExpertsManifest)
        except ValueError as exc:  # another folder's manifest, or not JSON
            raise ReportError(f"--experts {folder}: manifest.json is not an expert map's "
                              f"({str(exc).splitlines()[0]})") from None
        if manifest is None or not table.is_file():
            raise ReportError(f"--experts {folder}: no manifest.json and experts.csv there "
                              "(is it a `weightgraft experts` folder?)")
        if manifest.format != FORMAT:
            raise ReportError(f"--experts {folder}: manifest format {manifest.format or None!r}, not {FORMAT!r}")
        frame = pd.read_csv(table, keep_default_na=True)
        missing = [c for c in ("model", "template", "region", *COLUMNS) if c not in frame]
        if missing:
            raise ReportError(f"--experts {folder}: experts.csv lacks column(s) {', '.join(missing)}")
        self.name = folder.name
        self.metric = manifest.metric
        self.level = float(frame["level"].iloc[0]) if "level" in frame and len(frame) else 0.95
        self.models = list(dict.fromkeys(frame["model"].astype(str)))  # the finetune first, then controls
        self.sources = {label: entry.as_json() for label, entry in manifest.models.items()}
        self.n_prompts = dict(manifest.n_prompts)
        self.layers = sorted({int(x) for x in frame["layer"]})
        self.n_experts = 1 + int(frame["expert"].max()) if len(frame) else 0
        self.cells: dict[str, dict[str, dict[str, list[list[Any]]]]] = {}
        frame = frame.assign(declined=frame["declined"].where(frame["declined"].notna(), None))
        for (model, template, region), g in frame.groupby(["model", "template", "region"], sort=False):
            rows = [[_clean(r[c]) for c in COLUMNS] for r in g.sort_values(["layer", "expert"]).to_dict("records")]
            self.cells.setdefault(str(model), {}).setdefault(str(template), {})[str(region)] = rows
        self.templates = list(dict.fromkeys(str(t) for t in frame["template"]))
        self.regions = [r for r in REGIONS if r in set(frame["region"])]
        self.weights: dict[str, str] = {}  # per map model: same / other weights than explore's role of that name
        ids = pd.DataFrame()
        cells_path = folder / "expert_cells.parquet"
        if cells_path.is_file():
            ids = pd.read_parquet(cells_path, columns=["example_id", "template"]).drop_duplicates("example_id")
        known = _prompts_by_id(manifest.data or None, folder)
        self.examples = _examples([known[i] for i in ids.get("example_id", []) if i in known], known)

    def check(self, slot_list: Sequence[Slot]) -> None:
        """Refuse, in one line, a map whose layers or experts the loaded models' banks lack."""
        banks = {SlotName.parse(s.name).layer: s.experts for s in slot_list if s.experts}
        wrong = [layer for layer in self.layers if banks.get(layer, 0) < self.n_experts]
        if wrong:
            have = ", ".join(f"{layer}: {n}" for layer, n in sorted(banks.items())) or "none"
            raise ReportError(f"--experts {self.name}: the map has {self.n_experts} experts at layer {wrong[0]}; "
                              f"the loaded models' banks (layer: experts) are {have}")

    def compare_weights(self, hashes: Mapping[str, str]) -> None:
        """Say, per model of the map that explore has a role of the same name, whether their
        weights are the ones the map was computed on (``weights_sha256``)."""
        for model, digest in hashes.items():
            theirs = self.sources.get(model, {}).get("weights_sha256")
            if theirs:
                self.weights[model] = "same weights" if theirs == digest else "other weights than explore's"

    def to_json(self) -> dict[str, Any]:
        """What ``/api/experts`` hands the page."""
        return {"name": self.name, "metric": self.metric, "level": self.level, "models": self.models,
                "sources": {m: v.get("spec", v.get("source", "")) for m, v in self.sources.items()},
                "weights": self.weights, "n_prompts": self.n_prompts, "templates": self.templates,
                "regions": self.regions, "layers": self.layers, "n_experts": self.n_experts,
                "columns": list(COLUMNS), "cells": self.cells, "meaning": CELL_MEANING, "examples": self.examples}
