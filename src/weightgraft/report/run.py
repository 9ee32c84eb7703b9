"""A run directory as the report reads it: results, summary, manifest and scheme labels."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from weightgraft.engine.metric_table import chart_labels
from weightgraft.errors import WeightgraftError
from weightgraft.experiments.config import ExperimentConfig
from weightgraft.experiments.metrics import SUMMARY_KEYS, summarize
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import SweepManifest
from weightgraft.schemes.selectors import SelectorError, select_layers

RESULTS_FILE = "results.parquet"
SUMMARY_FILE = "summary.csv"
MANIFEST_FILE = "manifest.json"
REQUIRED_COLUMNS: tuple[str, ...] = (
    "model_set", "template", "scheme", "family", "labels", "example_id", "prompt", "answer",
    "target_token", "rank", "prob", "top1", "top5", "top10", "top20", "top50", "top100",
    "answer_logprob", "top_tokens", "top_probs", "finite",
)
METRICS: dict[str, str] = chart_labels()  # summary column -> axis label (``engine.metric_table``)
BAR_COLOURS = {"top5": "#3b6ea8", "top1": "#e08a3c"}
MAX_LISTED = 100  # exclusions and non-finite rows listed in the HTML page


class ReportError(WeightgraftError, ValueError):
    """A run directory that cannot be reported on."""


class MissingResultsError(ReportError):
    """The run directory holds no results.parquet."""


@dataclass(frozen=True)
class Run:
    """Everything a report reads from one run directory."""

    path: Path
    results: pd.DataFrame
    summary: pd.DataFrame
    manifest: SweepManifest  # typed; a dict is read as one
    labels: dict[tuple[str, str, str], dict[str, str]]  # (model_set, template, scheme) -> labels

    def __post_init__(self) -> None:
        if not isinstance(self.manifest, SweepManifest):
            object.__setattr__(self, "manifest", SweepManifest.model_validate(self.manifest or {}))


@dataclass(frozen=True)
class ReportFigure:
    """One figure written as PNG and SVG."""

    title: str
    model_set: str
    template: str
    png: Path
    svg: Path


@dataclass(frozen=True)
class ReportPaths:
    """The files :func:`write_report` wrote."""

    out_dir: Path
    summary_md: Path
    html: Path
    figures: tuple[ReportFigure, ...]

    @property
    def png(self) -> list[Path]:
        """Every PNG figure."""
        return [f.png for f in self.figures]

    @property
    def svg(self) -> list[Path]:
        """Every SVG figure."""
        return [f.svg for f in self.figures]

    def all(self) -> list[Path]:
        """Every file written."""
        return [self.summary_md, self.html, *self.png, *self.svg]


# ---------------------------------------------------------------------------------------------
# Loading


def load_run(run_dir: Path) -> Run:
    """Read a run directory; the summary is recomputed if summary.csv is missing."""
    run_dir = Path(run_dir)
    results_path = run_dir / RESULTS_FILE
    if not results_path.is_file():
        raise MissingResultsError(
            f"{results_path} not found: there is no {RESULTS_FILE} in {run_dir}. It is written by "
            "the experiment runner (`weightgraft run CONFIG`); give `weightgraft report` the run "
            "directory that command wrote."
        )
    results = pd.read_parquet(results_path)
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        raise ReportError(f"{results_path} lacks the columns {', '.join(missing)}")
    if results.empty:
        raise ReportError(f"{results_path} holds no rows: nothing to report")
    for key in (*SUMMARY_KEYS, "family"):
        results[key] = results[key].astype(str)
    results["direction"] = results["direction"].fillna("").astype(str) if "direction" in results else ""
    summary_path = run_dir / SUMMARY_FILE
    summary = read_summary(summary_path) if summary_path.is_file() else summarize(results)
    manifest = RunFolder(run_dir).read(SweepManifest) or SweepManifest()
    return Run(run_dir, results, summary, manifest, scheme_labels(results))


def read_summary(path: Path) -> pd.DataFrame:
    """summary.csv with names and notes kept as text (a scheme called "NA" stays "NA"; a
    ``recovery_note`` saying the ratio is unstable stays with its number)."""
    header = pd.read_csv(path, nrows=0).columns
    text_cols = [*SUMMARY_KEYS, "family", "direction", *(c for c in header if c.endswith("_note"))]
    df = pd.read_csv(path, dtype={c: str for c in text_cols}, keep_default_na=False)
    if "direction" not in df:  # a summary written before directions were kept apart
        df.insert(2, "direction", "")
    for col in df.columns:
        if col not in text_cols:
            df[col] = pd.to_numeric(df[col].replace("", np.nan), errors="coerce")
    return df


def parse_labels(value: object) -> dict[str, str]:
    """A scheme's labels from its JSON text (or a dict); empty when absent."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return {}
    parsed = json.loads(str(value))
    if not isinstance(parsed, dict):
        raise ReportError(f"scheme labels must be a JSON object, got {value!r}")
    return {str(k): str(v) for k, v in parsed.items()}


def scheme_labels(results: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, str]]:
    """Labels of each (model_set, template, scheme), from its first row."""
    first = results.drop_duplicates(SUMMARY_KEYS)
    return {
        (str(r.model_set), str(r.template), str(r.scheme)): parse_labels(r.labels)
        for r in first.itertuples(index=False)
    }


GROUP_KEYS = ["model_set", "template", "direction"]


def _groups(summary: pd.DataFrame) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    """Summary rows by (model_set, template, direction), in file order; direction is empty
    for prompts without one."""
    if "direction" not in summary:
        summary = summary.assign(direction="")
    return [
        ((str(ms), str(tpl), str(d)), g.reset_index(drop=True))
        for (ms, tpl, d), g in summary.groupby(GROUP_KEYS, sort=False)
    ]


def report_title(run: Run) -> str:
    """The name the run's config gives the sweep (``name:``), so a report reads as the user's
    experiment; the folder's name only where the config names none (no ``name:``, so the
    default ``experiment``, or no config recorded)."""

    name = str(run.manifest.config.get("name") or "").strip()
    unnamed = ("", str(ExperimentConfig.model_fields["name"].default))
    return name if name not in unnamed else run.path.name


def group_title(key: tuple[str, str, str], sep: str = " / ") -> str:
    """``model set / template`` (``/ direction`` when the prompts have one)."""
    return sep.join(part for part in key if part)


def model_rows(manifest: SweepManifest) -> list[tuple[str, str, str, str, str]]:
    """(model set, role, spec, source, weights sha256) of every model the run loaded, from
    the manifest's ``models`` (model set -> role -> entry)."""
    rows = []
    for set_name, roles in manifest.models.items():
        for role, info in roles.items():
            rows.append((str(set_name), str(role), info.spec, info.source, info.weights_sha256))
    return rows


def layer_ranges(manifest: SweepManifest, model_set: str) -> dict[str, tuple[int, int]]:
    """Scheme -> (first, last) layer its rules graft in this model set, from the schemes and the
    model depth the manifest records; empty when the depth is not recorded. Schemes with layer
    dropout or layers that are not one contiguous range are left out."""

    depths = {info.n_layers for info in manifest.models.get(model_set, {}).values()}
    depths.discard(None)
    if len(depths) != 1:
        return {}
    (n_layers,) = depths
    out = {}
    for scheme in manifest.schemes:
        rules = scheme.get("rules") or []
        if not rules or any(r.get("layer_dropout") for r in rules):
            continue
        try:
            layers = sorted({x for r in rules for x in select_layers(str(r.get("layers", "all")), int(n_layers))})
        except SelectorError:
            continue
        if layers and layers == list(range(layers[0], layers[-1] + 1)):
            out[str(scheme["name"])] = (layers[0], layers[-1])
    return out
