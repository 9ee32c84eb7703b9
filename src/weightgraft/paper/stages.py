"""The paper's resumable stages: :mod:`weightgraft.resume.stages`, where every pipeline's keyed
stages live (this module keeps the names the paper's modules and earlier callers import)."""

from __future__ import annotations

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

__all__ = ["KEY_CHARS", "STAGE_FILE", "STAGE_FORMAT", "Stage", "file_digest", "stage_key", "stage_path"]
