"""The output directory of a finetune: its files, result, and resume checks."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from weightgraft.resume.manifests import Json
from weightgraft.training.errors import TrainingError

MANIFEST_NAME = "training_manifest.json"
RUN_CONFIG_NAME = "training_run.json"
CHECKPOINTS = "checkpoints"
EVAL_BEFORE_NAME = "training_eval_before.json"
LOG_NAME = "training_log.json"


class RunConfig(TypedDict):
    """``training_run.json``: what makes a finetune this finetune (a folder holding another's is
    refused, a resumed one must match); the optional keys are written only where set, so runs
    saved before them still match."""

    base_model: str
    data_manifest_sha256: str | None
    train_sha256: str | None
    validation_sha256: str | None
    split: str
    preset: Json  # the TrainPreset's dump
    seed: int
    max_steps: int | None
    freeze_embed: bool
    freeze_unembed: bool
    supplemental_sha256: str | None
    templates: Sequence[str] | None  # None: every training template
    lora: NotRequired[Json]
    quantization: NotRequired[str]
    save_every: NotRequired[int]
    base_model_sha256: NotRequired[str | None]  # added once the model is loaded


class TrainingResults(TypedDict):
    """The manifest's ``results``: losses, the kept checkpoint, steps, epochs and time."""

    train_loss: float
    train_loss_mean: float
    eval_loss_before: float | None
    eval_loss: float
    train_loss_by_template: dict[str, float]  # the saved model on (up to 16 of) its training texts of each template
    best_checkpoint: str | None
    global_step: int
    epochs: float
    resumed_from: str | None
    seconds: float


class TrainingManifest(TypedDict):
    """``training_manifest.json``: what went in (base, data, preset, options) and what came out;
    its presence marks a finished run. One written by an older version may lack keys (read
    those with ``.get``)."""

    format: str
    created: str
    base_model: Json  # spec, source, weights_sha256
    data: Json  # dir, digests, split, templates, counts, supplemental
    preset: Json
    seed: int
    max_steps: int | None
    freeze_embed: bool
    freeze_unembed: bool
    untied_embeddings: Any
    lora: NotRequired[Json]
    quantization: NotRequired[str]
    parameters: dict[str, int]  # total, trainable
    results: TrainingResults
    model: dict[str, str]  # weights_sha256
    hardware: Json
    versions: dict[str, str | None]


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
    manifest: TrainingManifest
    train_loss: float | None
    eval_loss: float | None
    eval_loss_before: float | None
    weights_sha256: str
    train_loss_by_template: dict[str, float] | None = None

    @classmethod
    def from_manifest(cls, out_dir: Path, manifest: TrainingManifest) -> TrainResult:
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


def _compare_run_config(out: Path, run_config: RunConfig, what: str) -> None:
    """Refuse to resume (or reuse) a run in ``out`` made with other settings."""
    saved = out / RUN_CONFIG_NAME
    if not saved.is_file():
        return
    before = json.loads(saved.read_text())
    # before the model is loaded, its hash is not known yet: compare what is
    changed = sorted(k for k, value in run_config.items() if before.get(k) != value)
    if changed:
        raise TrainingError(
            f"cannot resume in {out}: these settings differ from {what}: "
            f"{', '.join(changed)}. Use the same settings, or a new --out."
        )


def _check_out_dir(out: Path, resume: bool, run_config: RunConfig) -> str | None:
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
