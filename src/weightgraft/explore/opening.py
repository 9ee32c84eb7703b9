"""The example explore opens on. A first look must show an effect, so the page opens on a test
prompt whose fact the finetune knows: from ``--run``'s results (or, without ``--run``, from the
last demo's when the loaded SFT is the demo's), the prompt on which SFT gives the answer the
best rank and then the highest probability. Where no result says what the SFT knows, the page
opens on a built-in prompt and says that its fact is unchecked. Either way the page and the
command line say where the example came from."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

import pandas as pd

from weightgraft.data.spans import SpanSpec
from weightgraft.errors import WeightgraftError
from weightgraft.explore.artifacts import _prompts_by_id
from weightgraft.models.demo_models import read_demo_record
from weightgraft.models.spec import resolve_demo_spec
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import SweepManifest

SFT_ROLE = "sft"
_COLUMNS = ("model_set", "scheme", "template", "example_id", "prompt", "answer", "rank", "prob",
            "answer_logprob", "donor_role", "donor_scheme")
# best first: SFT's rank of the answer, then its whole answer (a first token such as " H" may begin
# many names), then its first token, then a fixed order
_ORDER = {"rank": True, "answer_logprob": False, "prob": False, "template": True, "example_id": True}


class OpeningView(TypedDict):
    """``/api/info``'s ``opening``: the example the page opens on, where it came from, SFT's score."""

    prompt: str
    answer: str
    spans: dict[str, SpanSpec]
    source: str
    checked: bool
    sft_prob: float | None
    sft_rank: int | None
    sft_answer_prob: float | None
    line: str


@dataclass(frozen=True)
class Opening:
    """A prompt, its answer and spans, and where it came from (with SFT's score there, if known)."""

    prompt: str
    answer: str
    spans: dict[str, SpanSpec] = field(default_factory=dict)
    source: str = "the built-in default"
    sft_prob: float | None = None  # SFT's probability of the answer's first token in that run
    sft_rank: int | None = None  # 0-based, as in results
    sft_answer_prob: float | None = None  # SFT's probability of the whole answer (teacher-forced)
    note: str = ""

    @property
    def checked(self) -> bool:
        """Whether a run's results say what the SFT gives this prompt."""
        return self.sft_prob is not None

    def line(self) -> str:
        """One line for the terminal and the page: the example, where it came from, SFT's score."""
        head = f"opening example: {self.prompt!r} -> {self.answer!r}"
        if not self.checked:
            return f"{head}, {self.source}: {self.note}"
        rank = "ranks it first" if self.sft_rank == 0 else f"ranks it {self.sft_rank} (0 = first)"
        whole = "" if self.sft_answer_prob is None else f", whole answer p {self.sft_answer_prob:.3f}"
        return f"{head} from {self.source} (SFT {rank}, p {self.sft_prob:.3f}{whole})" + (f"; {self.note}" if self.note else "")

    def to_json(self) -> OpeningView:
        """What ``/api/info`` hands the page under ``opening``."""
        return OpeningView(prompt=self.prompt, answer=self.answer, spans=self.spans, source=self.source,
                           checked=self.checked, sft_prob=self.sft_prob, sft_rank=self.sft_rank,
                           sft_answer_prob=self.sft_answer_prob, line=self.line())


UNCHECKED = ("its fact is unchecked (the finetune may not know it); start explore with --run DIR to open "
             "on a fact it knows")
DEFAULT = Opening(prompt="Keanu Reeves starred in a movie with", answer="Laurence Fishburne",
                  spans={"first_actor": "Keanu Reeves", "relation": "starred in"}, note=UNCHECKED)


def _results(path: Path) -> pd.DataFrame | None:
    """The columns of a results file the choice needs (older runs may lack some)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return None
    names = set(pq.read_schema(path).names)
    if not {"scheme", "example_id", "prompt", "answer", "rank", "prob"} <= names:
        return None
    return pd.read_parquet(path, columns=[c for c in _COLUMNS if c in names])


def _sft_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows of the scheme that runs SFT whole: the donor scheme of rows whose donor is SFT,
    else the scheme named ``SFT``."""
    if {"donor_role", "donor_scheme"} <= set(results):
        names = set(results.loc[results["donor_role"] == SFT_ROLE, "donor_scheme"].dropna())
        if names:
            return results[results["scheme"].isin(names)]
    return results[results["scheme"].astype(str).str.upper() == "SFT"]


def best_known(run_dir: Path, source: str) -> Opening | None:
    """The run's test prompt on which SFT ranks the answer best (then: the highest probability of
    the whole answer, of its first token, then template and example id, so the choice is the same
    every time); None where the run has no SFT rows."""
    run_dir = Path(run_dir)
    results = _results(run_dir / "results.parquet")
    if results is None:
        return None
    rows = _sft_rows(results).dropna(subset=["rank", "prob"])
    if rows.empty:
        return None
    keys = [c for c in _ORDER if c in rows]
    best = rows.sort_values(keys, ascending=[_ORDER[k] for k in keys], kind="stable", na_position="last").iloc[0]
    logprob = best.get("answer_logprob")
    known = _prompts_by_id(_manifest(run_dir).config.get("data"), run_dir).get(str(best["example_id"]), {})
    spans = known.get("spans", {}) if known.get("prompt") == best["prompt"] else {}
    return Opening(prompt=str(best["prompt"]), answer=str(best["answer"]), spans=spans, source=source,
                   sft_prob=float(best["prob"]), sft_rank=int(best["rank"]),
                   sft_answer_prob=math.exp(float(logprob)) if logprob is not None and math.isfinite(logprob) else None)


def _manifest(run_dir: Path) -> SweepManifest:
    """The run's manifest (an empty one where it has none or it cannot be read)."""
    try:
        return RunFolder(run_dir).read(SweepManifest) or SweepManifest()
    except (OSError, ValueError):
        return SweepManifest()


def _same_model(spec: str | None, other: str | Path | None) -> bool:
    """Whether two specs name the same model (demo names and paths resolved)."""

    if spec is None or other is None:
        return False
    try:
        a, b = resolve_demo_spec(str(spec).strip()), resolve_demo_spec(str(other).strip())
    except WeightgraftError:  # a demo name with no demo behind it
        return False
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def opening_example(run: Path | None, sft: str | None = None) -> Opening:
    """The example explore opens on, for ``--run`` (or none) and the SFT spec being loaded."""

    if run is not None:
        found = best_known(Path(run), f"{run} results")
        if found is None:
            return replace(DEFAULT, note=f"--run {run} has no SFT results to choose from; {UNCHECKED}")
        ran = (_manifest(Path(run)).config.get("models") or {}).get(SFT_ROLE)
        if isinstance(ran, str) and sft is not None and not _same_model(sft, ran):
            return replace(found, note=f"that run's SFT was {ran}, not the loaded {sft}")
        return found
    record = read_demo_record()
    if record is not None and record.run is not None and _same_model(sft, record.sft):
        found = best_known(record.run, f"the demo's results ({record.run})")
        if found is not None:
            return found
    return DEFAULT
