"""The named steps of :func:`weightgraft.training.trainer.finetune`: its options as one typed
object, the preset, the data, the run's identity (``run_config``), the base model, the Trainer's
schedule, the losses read around training and the manifest a finished run leaves.

Each step is a function of what it names, so ``finetune`` reads as the run it is: check ->
read -> claim the folder -> load -> train -> measure -> record.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from weightgraft import atomic
from weightgraft.errors import validation_line
from weightgraft.models import LoadedModel, load_model
from weightgraft.models.spec import quantized
from weightgraft.planning.calibration import device_name
from weightgraft.resume.manifests import Json
from weightgraft.training.device import training_device
from weightgraft.training.errors import TrainingError
from weightgraft.training.lora import LoraSettings
from weightgraft.training.outputs import (
    CHECKPOINTS,
    EVAL_BEFORE_NAME,
    RunConfig,
    TrainingManifest,
    TrainingResults,
    _say,
    _sha256_file,
    _version,
)
from weightgraft.training.presets import TrainPreset, get_preset
from weightgraft.training.texts import TextRecord, _read_supplemental, split_records

__all__ = ["FinetuneOptions", "Schedule", "TrainingData", "base_model", "base_spec", "final_loss", "loss_before",
           "manifest", "preset_settings", "read_data", "results", "run_config", "schedule"]


@dataclass(frozen=True)
class FinetuneOptions:
    """``finetune``'s options beyond what it trains (model, data, split, preset, out): one
    typed object the steps read, built from ``finetune``'s keywords (their meaning is there)."""

    seed: int = 0
    freeze_embed: bool = False
    freeze_unembed: bool = False
    resume: bool = False
    supplemental_text: str | os.PathLike[str] | None = None
    max_steps: int | None = None
    keep_checkpoints: bool = False
    allow_pickle: bool = False
    callbacks: list[Any] | None = None
    templates: Sequence[str] | None = None
    lora: LoraSettings | None = None
    quantization: str | None = None
    device: str | None = None
    save_every: int | None = None

    def checked(self, model_spec: object) -> FinetuneOptions:
        """The options refused in one line where they cannot go together, with the device
        resolved (``cpu``, ``cuda`` or ``mps``) and the templates a list."""
        if self.max_steps is not None and self.max_steps < 1:
            raise TrainingError("max_steps must be at least 1")
        if self.save_every is not None and (self.save_every < 1 or self.lora is not None):
            raise TrainingError(f"--save-every {self.save_every}: " + (
                "snapshots are whole models; a LoRA finetune's would be adapters (not supported)"
                if self.lora is not None else "give N >= 1 steps"))
        device = training_device(self.device)
        if self.quantization is not None and (self.lora is None or isinstance(model_spec, LoadedModel)):
            raise TrainingError(f"--quantization {self.quantization} trains a LoRA adapter over the base loaded "
                                "quantized (QLoRA): add --lora RANK and give the base by its spec (quantized weights "
                                "do not train)")
        templates = self.templates
        templates = list(templates) if templates is not None and not isinstance(templates, str) else templates
        return replace(self, device=device, templates=templates)


def preset_settings(preset: str | os.PathLike[str] | TrainPreset, overrides: Json) -> TrainPreset:
    """The preset with ``overrides`` applied (a :class:`TrainPreset` object validated again)."""
    if not isinstance(preset, TrainPreset):
        return get_preset(preset, **overrides)
    try:
        given = {k: v for k, v in overrides.items() if v is not None}
        return TrainPreset.model_validate({**preset.model_dump(), **given})
    except ValidationError as exc:
        raise TrainingError(f"invalid preset overrides: {validation_line(exc)}") from None


@dataclass(frozen=True)
class TrainingData:
    """The split's records and texts, and the general text added to training (if any)."""

    root: Path
    train_records: list[TextRecord]
    train_texts: list[str]
    val_texts: list[str]
    supplemental: list[str]
    supplemental_path: Path | None


def read_data(root: Path, split: str, settings: TrainPreset, opts: FinetuneOptions) -> TrainingData:
    """One split's training and validation texts, with the supplemental general text a preset
    may require (refused in one line where it is required and missing)."""
    train_records, val_records = split_records(root, split, opts.templates)
    train_texts = [r["text"] for r in train_records]
    supplemental: list[str] = []
    supplemental_path = None
    if opts.supplemental_text is not None:
        supplemental_path = Path(opts.supplemental_text).expanduser().resolve()
        supplemental = _read_supplemental(supplemental_path)
        supplemental = supplemental[:settings.supplemental_count(len(train_texts), len(supplemental))]
    elif settings.requires_supplemental:
        raise TrainingError(
            f"preset {settings.name!r} also trains on general text (paper A.3.3: 10,000 "
            "examples) so the model does not drift; pass supplemental_text=FILE (CLI: "
            "--supplemental FILE): a .jsonl with a 'text' field per line, or plain text with "
            "one example per line"
        )
    val_texts = [r["text"] for r in val_records]
    return TrainingData(root, train_records, train_texts, val_texts, supplemental, supplemental_path)


def run_config(model_spec: str | os.PathLike[str] | LoadedModel, data: TrainingData, split: str,
               settings: TrainPreset, opts: FinetuneOptions) -> RunConfig:
    """What makes the run this run: a folder holding another's is refused, a resumed one must match."""
    lora, quantization, save_every = opts.lora, opts.quantization, opts.save_every
    config: RunConfig = {
        "base_model": model_spec.source if isinstance(model_spec, LoadedModel) else os.fspath(model_spec),
        "data_manifest_sha256": _sha256_file(data.root / "manifest.json"),
        "train_sha256": _sha256_file(data.root / "train.jsonl"),
        "validation_sha256": _sha256_file(data.root / "validation.jsonl"),
        "split": split,
        "preset": settings.model_dump(),
        "seed": opts.seed,
        "max_steps": opts.max_steps,
        "freeze_embed": opts.freeze_embed,
        "freeze_unembed": opts.freeze_unembed,
        "supplemental_sha256": _sha256_file(data.supplemental_path) if data.supplemental_path else None,
        "templates": opts.templates,  # None, as in runs saved before the option: every template
    }
    if lora is not None:  # each optional key only where set: runs saved before it still match
        config["lora"] = lora.model_dump()
    if quantization is not None:
        config["quantization"] = quantization
    if save_every is not None:
        config["save_every"] = save_every
    return config


def base_spec(model_spec: str | os.PathLike[str] | LoadedModel, opts: FinetuneOptions) -> Any:
    """The spec the base loads from (quantized under QLoRA), parsed before any data is read;
    None for a :class:`LoadedModel`, which is trained as it was loaded."""
    if isinstance(model_spec, LoadedModel):
        return None
    spec = os.fspath(model_spec)
    return quantized(spec, opts.quantization) if opts.quantization is not None else spec


def base_model(model_spec: str | os.PathLike[str] | LoadedModel, spec: Any,
               opts: FinetuneOptions) -> tuple[LoadedModel, str]:
    """The model to train and its spec's text: a :class:`LoadedModel` as given, else ``spec``
    loaded, one process converting an embedded model for the others."""
    if isinstance(model_spec, LoadedModel):
        return model_spec, model_spec.source
    from accelerate import PartialState

    with PartialState().main_process_first():
        loaded = load_model(spec, allow_pickle=opts.allow_pickle)
    return loaded, os.fspath(model_spec)


@dataclass(frozen=True)
class Schedule:
    """The Trainer's arguments and the counts the run reports (steps, processes)."""

    args: Any  # transformers.TrainingArguments
    steps_per_epoch: int
    total_steps: int
    world: int


def schedule(settings: TrainPreset, out_dir: Path, opts: FinetuneOptions, n_train: int) -> Schedule:
    """When to evaluate and save (every ``eval_steps``, at ``max_steps`` within the first epoch,
    else each epoch) and the Trainer's arguments for it."""
    from transformers import TrainingArguments

    max_steps, device = opts.max_steps, opts.device
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = settings.batch_size * settings.gradient_accumulation_steps * world
    steps_per_epoch = max(1, math.ceil(n_train / per_step))
    if settings.eval_steps is not None:
        strategy, every = "steps", settings.eval_steps
    elif max_steps is not None and max_steps < steps_per_epoch:
        strategy, every = "steps", max_steps
    else:
        strategy, every = "epoch", None
    # None with the epoch strategy, as the Trainer reads neither then
    every_steps: dict[str, Any] = {"eval_steps": every, "save_steps": every}
    total_steps = max_steps or math.ceil(steps_per_epoch * settings.epochs)
    args = TrainingArguments(
        output_dir=str(out_dir / CHECKPOINTS),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        num_train_epochs=settings.epochs,
        max_steps=max_steps if max_steps is not None else -1,
        learning_rate=settings.learning_rate,
        weight_decay=settings.weight_decay,
        lr_scheduler_type=settings.lr_scheduler,
        warmup_steps=settings.warmup_ratio,
        max_grad_norm=settings.max_grad_norm,
        fp16=device == "cuda" and settings.gpu_precision == "fp16",
        bf16=device == "cuda" and settings.gpu_precision == "bf16",
        eval_strategy=strategy,
        save_strategy=strategy,
        **every_steps,
        save_total_limit=1,
        load_best_model_at_end=settings.keep_best,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_strategy="steps",
        logging_steps=max(1, min(10, steps_per_epoch // 4 or 1)),
        train_sampling_strategy="group_by_length" if settings.group_by_length else "random",
        seed=opts.seed,
        data_seed=opts.seed,
        report_to="none",
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        prediction_loss_only=True,  # never gather [batch, tokens, vocab] logits
    )
    return Schedule(args, steps_per_epoch, total_steps, world)


def loss_before(trainer: Any, out_dir: Path, resume_from: str | None) -> float | None:
    """The validation loss before training: measured (and kept) on a fresh run, read back on a
    resumed one (None where a run from before the file lacks it)."""
    before_file = out_dir / EVAL_BEFORE_NAME
    if resume_from is None:
        eval_before = float(trainer.evaluate()["eval_loss"])
        if trainer.is_world_process_zero():
            atomic.write_json(before_file, {"eval_loss_before": eval_before})
        return eval_before
    _say(f"resuming from {resume_from}")
    return json.loads(before_file.read_text())["eval_loss_before"] if before_file.is_file() else None


def final_loss(trainer: Any, settings: TrainPreset) -> float:
    """The validation loss of the model kept: the best checkpoint's, or the last step's."""
    state = trainer.state
    if settings.keep_best and state.best_metric is not None and state.best_model_checkpoint:
        return float(state.best_metric)  # the model now is that checkpoint's
    at_end = [h["eval_loss"] for h in state.log_history if "eval_loss" in h and h.get("step") == state.global_step]
    # the last step's evaluation is of the model saved now; else evaluate it
    return float(at_end[-1]) if at_end else float(trainer.evaluate()["eval_loss"])


def manifest(*, loaded: LoadedModel, spec_text: str, data: TrainingData, config: RunConfig, split: str,
             settings: TrainPreset, opts: FinetuneOptions, untied: Any, counts: tuple[int, int],
             results: TrainingResults, weights: str, args: Any, world: int) -> TrainingManifest:
    """``training_manifest.json``: what went in (base, data, preset, options) and what came out."""
    supplemental = None if data.supplemental_path is None else {
        "path": str(data.supplemental_path), "sha256": config["supplemental_sha256"], "n": len(data.supplemental)}
    out: TrainingManifest = {
        "format": "weightgraft-training-manifest/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base_model": {"spec": spec_text, "source": loaded.source, "weights_sha256": loaded.weights_sha256},
        "data": {
            "dir": str(data.root),
            "manifest_sha256": config["data_manifest_sha256"],
            "train_sha256": config["train_sha256"],
            "validation_sha256": config["validation_sha256"],
            "split": split,
            "templates": opts.templates,  # None: every training template
            "n_train": len(data.train_texts),
            "n_validation": len(data.val_texts),
            "supplemental": supplemental,
        },
        "preset": settings.model_dump(),
        "seed": opts.seed,
        "max_steps": opts.max_steps,
        "freeze_embed": opts.freeze_embed,
        "freeze_unembed": opts.freeze_unembed,
        "untied_embeddings": untied,
        "parameters": {"total": counts[0], "trainable": counts[1]},
        "results": results,
        "model": {"weights_sha256": weights},
        # the thread count and CPU set the order of float sums: the same recipe and seed on another
        # thread count trains other weights (docs/paper.md, "The demo"), so both are recorded
        "hardware": {"device": opts.device, "world_size": world, "fp16": args.fp16, "bf16": args.bf16,
                     "threads": torch.get_num_threads(), "machine": platform.machine(),
                     "processor": device_name(opts.device or "cpu")},
        "versions": {
            "python": platform.python_version(),
            "weightgraft": _version("weightgraft"),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "accelerate": _version("accelerate"),
        },
    }
    if opts.lora is not None:
        out["lora"] = opts.lora.model_dump()
    if opts.quantization is not None:
        out["quantization"] = opts.quantization
    return out


def results(trainer: Any, train_output: Any, *, train_loss: float, eval_before: float | None, final_eval: float,
            by_template: dict[str, float], resume_from: str | None, started: float) -> TrainingResults:
    """The manifest's ``results``: losses, the kept checkpoint, steps, epochs and time."""
    state = trainer.state
    return {
        "train_loss": train_loss,
        "train_loss_mean": float(train_output.training_loss),
        "eval_loss_before": eval_before,
        "eval_loss": final_eval,
        # the saved model on (up to 16 of) its training texts of each template
        "train_loss_by_template": by_template,
        "best_checkpoint": Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None,
        "global_step": int(state.global_step),
        "epochs": float(state.epoch or 0.0),
        "resumed_from": Path(resume_from).name if resume_from else None,
        "seconds": round(time.time() - started, 1),
    }
