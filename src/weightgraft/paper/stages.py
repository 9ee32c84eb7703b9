"""The paper's resumable stages: :mod:`weightgraft.resume.stages` (where every pipeline's keyed
stages live), and each stage kind's outputs typed, so that a record (``stage.json``) is one
pydantic model from the stage that writes it to the report that reads it:
``StageRecord[FinetuneOutputs]`` and so on. Each reads every ``stage.json`` an earlier weightgraft
wrote (a key it lacks takes its default, a key it does not declare is kept)."""

from __future__ import annotations

from pydantic import Field

from weightgraft.resume.folder import Record
from weightgraft.resume.manifests import Json, StageRecord
from weightgraft.resume.stages import (
    KEY_CHARS as KEY_CHARS,
)
from weightgraft.resume.stages import (
    STAGE_FILE as STAGE_FILE,
)
from weightgraft.resume.stages import (
    STAGE_FORMAT as STAGE_FORMAT,
)
from weightgraft.resume.stages import (
    Stage as Stage,
)
from weightgraft.resume.stages import (
    file_digest as file_digest,
)
from weightgraft.resume.stages import (
    stage_key as stage_key,
)
from weightgraft.resume.stages import (
    stage_path as stage_path,
)

__all__ = ["KEY_CHARS", "STAGE_FILE", "STAGE_FORMAT", "Check", "ClaimsOutputs", "ClaimsRecord", "DataOutputs",
           "DataRecord", "FinetuneOutputs", "FinetuneRecord", "GeneralTextOutputs", "GeneralTextRecord", "Stage",
           "SweepOutputs", "SweepRecord", "TrajectoryClaimsOutputs", "TrajectoryClaimsRecord", "TrajectoryOutputs",
           "TrajectoryRecord", "file_digest", "stage_key", "stage_path"]


class DataOutputs(Record):
    """A dataset's stage: its folder and the digest of its manifest."""

    dir: str = "data"
    sha256: str = ""


class GeneralTextOutputs(Record):
    """The general text's stage (Fig. 13's finetune mixes it in): its file, size and digest."""

    file: str = "general.jsonl"
    n: int = 0
    sha256: str = ""


class Check(Record):
    """A finetune's precondition on one test sentence and direction: its top-5 on its own facts."""

    template: str = ""
    direction: str = ""
    top5: float = 0.0
    n: int = 0


class FinetuneOutputs(Record):
    """A finetune's stage: its model folder, its precondition checks, its training time."""

    model: str = "model"
    checks: list[Check] = Field(default_factory=list)
    train_seconds: float = 0.0


class SweepOutputs(Record):
    """A sweep's stage: its run folder, its summary rows and its drops' rows (None: finished
    before drops were kept, read off its rows when resumed)."""

    run: str = "run"
    summary: list[Json] = Field(default_factory=list)
    drops: list[Json] | None = None


class ClaimsOutputs(Record):
    """The claims' stage: localize's run folder, ``claims.csv``'s rows as the report keeps them,
    the claims' rules version (None: made before it was recorded) and, with several training
    seeds, the seed of each ``models.sft[i]``."""

    run: str = "run"
    claims: list[Json] = Field(default_factory=list)
    rules: int | None = None
    sft_seeds: list[int] | None = None


class TrajectoryOutputs(Record):
    """The trajectory sweep's stage: its run folder and its rows by step."""

    run: str = "run"
    rows: list[Json] = Field(default_factory=list)


class TrajectoryClaimsOutputs(Record):
    """The claims over the a2b finetune's snapshots: ``claims_steps.csv``'s rows."""

    run: str = "run"
    steps: list[Json] = Field(default_factory=list)
    rules: int | None = None


DataRecord = StageRecord[DataOutputs]
GeneralTextRecord = StageRecord[GeneralTextOutputs]
FinetuneRecord = StageRecord[FinetuneOutputs]
SweepRecord = StageRecord[SweepOutputs]
ClaimsRecord = StageRecord[ClaimsOutputs]
TrajectoryRecord = StageRecord[TrajectoryOutputs]
TrajectoryClaimsRecord = StageRecord[TrajectoryClaimsOutputs]
