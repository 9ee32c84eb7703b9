"""The output directory of a finetune: its files, result, and resume checks."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightgraft.training.errors import TrainingError

MANIFEST_NAME = "training_manifest.json"
RUN_CONFIG_NAME = "training_run.json"
CHECKPOINTS = "checkpoints"
EVAL_BEFORE_NAME = "training_eval_before.json"
LOG_NAME = "training_log.json"


@dataclass
class TrainResult:
    """What :func:`finetune` produced.

    Attributes:
        out_dir: the trained model directory (load it with ``load_model(out_dir)``).
        manifest: the content of ``out_dir/training_manifest.json``.
        train_loss: training loss of the last logging window.
        eval_loss: validation loss of the saved (best) model.
        eval_loss_before: validation loss of the base model (kept across a resume).
        weights_sha256: :func:`weightgraft.models.weights_sha256` of the saved model.
        train_loss_by_template: the saved model's loss on its training texts, per template
            (a template far above the others was not learned).
    """

    out_dir: Path
    manifest: dict[str, Any]
    train_loss: float | None
    eval_loss: float | None
    eval_loss_before: float | None
    weights_sha256: str
    train_loss_by_template: dict[str, float] | None = None

    @classmethod
    def from_manifest(cls, out_dir: Path, manifest: dict[str, Any]) -> TrainResult:
        results = manifest["results"]
        return cls(
            out_dir=out_dir,
            manifest=manifest,
            train_loss=results.get("train_loss"),
            eval_loss=results.get("eval_loss"),
            eval_loss_before=results.get("eval_loss_before"),
            weights_sha256=manifest["model"]["weights_sha256"],
            train_loss_by_template=results.get("train_loss_by_template"),
        )


def _sha256_file(path: Path) -> str | None:
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _say(message: str) -> None:
    if _is_main_process():
        print(f"[weightgraft] {message}", file=sys.stderr, flush=True)


def _compare_run_config(out: Path, run_config: dict[str, Any], what: str) -> None:
    """Refuse to resume (or reuse) a run in ``out`` made with other settings."""
    saved = out / RUN_CONFIG_NAME
    if not saved.is_file():
        return
    before = json.loads(saved.read_text())
    # before the model is loaded, its hash is not known yet: compare what is
    changed = sorted(k for k in run_config if before.get(k) != run_config[k])
    if changed:
        raise TrainingError(
            f"cannot resume in {out}: these settings differ from {what}: "
            f"{', '.join(changed)}. Use the same settings, or a new --out."
        )


def _check_out_dir(out: Path, resume: bool, run_config: dict[str, Any]) -> str | None:
    """Validate ``out``; return the checkpoint to resume from, if any."""
    from transformers.trainer_utils import get_last_checkpoint

    ckpt_dir = out / CHECKPOINTS
    if resume:
        _compare_run_config(out, run_config, "the interrupted run")
        last = get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None
        if last is None:
            _say(f"--resume: no checkpoint in {ckpt_dir} yet; starting from the beginning")
        return last
    if _is_main_process() and out.exists() and any(out.iterdir()):  # other ranks see rank 0's files
        raise TrainingError(
            f"output directory {out} is not empty; pass resume=True (--resume) to continue or "
            "reuse the run there, or choose another --out"
        )
    return None
