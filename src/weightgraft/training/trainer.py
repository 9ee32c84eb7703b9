"""Finetuning a pretrained model (PRE) into SFT / task / relation models with the HF Trainer.

:func:`finetune` reads a data directory written by ``weightgraft data build``
(``train.jsonl``, ``validation.jsonl``, ``manifest.json``), keeps the records of one *split*,
trains all (or all but the frozen) weights with next-token prediction on the text tokens, keeps
the checkpoint with the lowest validation loss, and writes to ``out``:

- ``model.safetensors`` + ``config.json`` + tokenizer files (loadable with
  :func:`weightgraft.models.load_model`),
- ``training_manifest.json``: what went in (base model hash, data hashes, split, preset,
  seed, versions) and what came out (losses, steps, weights hash),
- ``training_log.json``: the Trainer's log history (train / validation losses over steps),
- ``checkpoints/`` while training (removed at the end unless ``keep_checkpoints=True``).

Splits (the ``group`` / ``direction`` fields of each record):

- ``both``: every record, both directions (the paper's SFT model);
- ``a2b`` / ``b2a``: only records of that direction (the reversal-curse base models);
- ``task``: only records whose ``group`` is ``"task"``, all directions: relations disjoint
  from the evaluation set, so the model learns the *task format* without the evaluated facts
  (the hybrid experiment's task model);
- ``relation``: only records whose ``group`` is ``"relation"``, all directions: the
  evaluated facts (the hybrid experiment's relation model).

Several GPUs: the same call runs unchanged under ``torchrun`` / ``accelerate launch`` (the
Trainer does data-parallel training; only the main process writes the outputs).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from weightgraft import atomic
from weightgraft.models import LoadedModel, load_model, weights_sha256
from weightgraft.training.embeddings import freeze_embeddings
from weightgraft.errors import validation_line
from weightgraft.training.device import training_device
from weightgraft.training.errors import TrainingError
from weightgraft.models.spec import quantized
from weightgraft.training.lora import LoraSettings, parameter_counts, wrap_lora
from weightgraft.training.outputs import (CHECKPOINTS, EVAL_BEFORE_NAME, LOG_NAME, MANIFEST_NAME, RUN_CONFIG_NAME, TrainResult,
                                          _check_out_dir, _compare_run_config, _is_main_process, _say, _sha256_file, _version)
from weightgraft.training.presets import TrainPreset, get_preset
from weightgraft.training.text_loss import loss_by_template, token_mean_loss, unlearned_templates
from weightgraft.training.texts import (
    _collator,
    _read_supplemental,
    _TokenizedTexts,
    split_records,
    texts_by_template,
)


def _trainer_class() -> type:
    """The HF Trainer, with a length-grouped sampler that is seeded per epoch.

    transformers' ``LengthGroupedSampler`` draws from the global RNG, so a run resumed in the
    middle of an epoch would see a different order than the uninterrupted run. Seeding it with
    ``data_seed + epoch`` (the Trainer calls ``set_epoch`` every epoch, on every process) makes
    the order a function of the epoch only: resumed runs match, and all data-parallel
    processes agree.
    """
    from transformers import Trainer
    from transformers.trainer_pt_utils import (
        LengthGroupedSampler,
        get_length_grouped_indices,
    )

    class _EpochSeededLengthGroupedSampler(LengthGroupedSampler):
        def __init__(self, base: LengthGroupedSampler, seed: int) -> None:
            self.batch_size, self.lengths, self.generator = base.batch_size, base.lengths, None
            self.seed, self.epoch = seed, 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)

        def __iter__(self):  # type: ignore[no-untyped-def]
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = get_length_grouped_indices(self.lengths, self.batch_size, generator=generator)
            return iter(order)

    class _Trainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):  # type: ignore[no-untyped-def]
            sampler = super()._get_train_sampler(train_dataset)
            if isinstance(sampler, LengthGroupedSampler):
                seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
                return _EpochSeededLengthGroupedSampler(sampler, seed)
            return sampler

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):  # type: ignore[no-untyped-def]
            # The Trainer's validation loss is a mean of batch means, and it batches by length
            # with a generator seeded by the training seed: one model's loss moved with the
            # seed (4.7297 vs 4.7770 on the demo before training). This one is the mean per
            # token, a function of the model and the data only.
            started = time.time()
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            loss = token_mean_loss(self.model, dataset.items, self.data_collator,
                                   self.args.per_device_eval_batch_size)
            metrics = {f"{metric_key_prefix}_loss": loss,
                       f"{metric_key_prefix}_runtime": round(time.time() - started, 4)}
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return _Trainer


def finetune(
    model_spec: str | os.PathLike[str] | LoadedModel,
    data_dir: str | os.PathLike[str],
    *,
    split: str,
    preset: str | os.PathLike[str] | TrainPreset,
    out: str | os.PathLike[str],
    seed: int = 0,
    freeze_embed: bool = False,
    freeze_unembed: bool = False,
    resume: bool = False,
    supplemental_text: str | os.PathLike[str] | None = None,
    max_steps: int | None = None,
    keep_checkpoints: bool = False,
    allow_pickle: bool = False,
    callbacks: list[Any] | None = None,
    templates: Sequence[str] | None = None,
    lora: LoraSettings | None = None,
    quantization: str | None = None,
    device: str | None = None,
    save_every: int | None = None,
    **overrides: Any,
) -> TrainResult:
    """Finetune a causal LM on one split of a relation dataset with the HF Trainer.

    Args:
        model_spec: anything :func:`weightgraft.models.load_model` takes, or a :class:`LoadedModel` (trained in place).
        data_dir: directory with ``train.jsonl``, ``validation.jsonl`` (``manifest.json``).
        split: ``relation`` | ``task`` | ``both`` | ``a2b`` | ``b2a`` (module docstring).
        preset: a :data:`PRESETS` name, a preset file, or a :class:`TrainPreset`.
        out: output directory (must be empty or new, unless ``resume``).
        seed: seeds the randomness of training (data order, dropout).
        freeze_embed / freeze_unembed: keep the (un)embedding matrix bit-identical; tied
            matrices are untied first when only one is frozen.
        resume: continue from the last checkpoint in ``out/checkpoints``; if ``out`` already
            holds the finished run, return it. Either way the settings must be the same.
        supplemental_text: file of general text added to the training set (required by
            ``paper-gentle``): ``.jsonl`` with ``text`` fields, else one example per line.
        max_steps: stop after this many optimizer steps (overrides the preset's epochs).
        keep_checkpoints: keep ``out/checkpoints`` after training.
        allow_pickle: passed to ``load_model``.
        callbacks: extra ``transformers.TrainerCallback`` objects.
        templates: train on these training templates only (e.g. ``["qa_1", "article_1"]``);
            validation keeps its held-out templates. Default: every template.
        lora: train a LoRA adapter instead (weightgraft.training.lora); ``out`` is then peft's
            adapter directory, a donor as ``peft(pre, out)``.
        quantization: QLoRA: the base loaded quantized (``nf4`` ...), ``lora`` trained over it.
        device: ``cpu``, ``cuda`` (the first visible card) or ``mps``; None: CUDA where visible.
        save_every: keep the model after step 1 and every N steps in ``out/trajectory/``, with
            ``out/trajectory.json`` (weightgraft.training.trajectory): a sweep's checkpoint donors.
        **overrides: preset fields to override, e.g. ``learning_rate=5e-5, epochs=2``.
    """
    from transformers import TrainingArguments, set_seed

    started = time.time()
    out_dir = Path(out).expanduser().resolve()
    data_root = Path(data_dir).expanduser().resolve()

    if isinstance(preset, TrainPreset):
        try:
            settings = TrainPreset.model_validate(
                {**preset.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
            )
        except ValidationError as exc:
            raise TrainingError(f"invalid preset overrides: {validation_line(exc)}") from None
    else:
        settings = get_preset(preset, **overrides)
    if max_steps is not None and max_steps < 1:
        raise TrainingError("max_steps must be at least 1")
    if save_every is not None and (save_every < 1 or lora is not None):
        raise TrainingError(f"--save-every {save_every}: " + ("snapshots are whole models; a LoRA finetune's would be "
                            "adapters (not supported)" if lora is not None else "give N >= 1 steps"))
    device = training_device(device)  # "cpu", "cuda" or "mps"
    if quantization is not None and (lora is None or isinstance(model_spec, LoadedModel)):
        raise TrainingError(f"--quantization {quantization} trains a LoRA adapter over the base loaded quantized (QLoRA): "
                            "add --lora RANK and give the base by its spec (quantized weights do not train)")
    base_spec = None if isinstance(model_spec, LoadedModel) else (
        quantized(os.fspath(model_spec), quantization) if quantization is not None else os.fspath(model_spec))

    templates = list(templates) if templates is not None and not isinstance(templates, str) else templates
    train_records, val_records = split_records(data_root, split, templates)
    train_texts = [r["text"] for r in train_records]
    val_texts = [r["text"] for r in val_records]
    supplemental: list[str] = []
    supplemental_path = None
    if supplemental_text is not None:
        supplemental_path = Path(supplemental_text).expanduser().resolve()
        supplemental = _read_supplemental(supplemental_path)
        supplemental = supplemental[:settings.supplemental_count(len(train_texts), len(supplemental))]
    elif settings.requires_supplemental:
        raise TrainingError(
            f"preset {settings.name!r} also trains on general text (paper A.3.3: 10,000 "
            "examples) so the model does not drift; pass supplemental_text=FILE (CLI: "
            "--supplemental FILE): a .jsonl with a 'text' field per line, or plain text with "
            "one example per line"
        )

    run_config: dict[str, Any] = {
        "base_model": (
            model_spec.source if isinstance(model_spec, LoadedModel) else os.fspath(model_spec)
        ),
        "data_manifest_sha256": _sha256_file(data_root / "manifest.json"),
        "train_sha256": _sha256_file(data_root / "train.jsonl"),
        "validation_sha256": _sha256_file(data_root / "validation.jsonl"),
        "split": split,
        "preset": settings.model_dump(),
        "seed": seed,
        "max_steps": max_steps,
        "freeze_embed": freeze_embed,
        "freeze_unembed": freeze_unembed,
        "supplemental_sha256": _sha256_file(supplemental_path) if supplemental_path else None,
        "templates": templates,  # None, as in runs saved before the option: every template
        **({"lora": lora.model_dump()} if lora is not None else {}),
        **({"quantization": quantization} if quantization is not None else {}),
        **({"save_every": save_every} if save_every is not None else {}),
    }
    if resume and (out_dir / MANIFEST_NAME).is_file():
        _compare_run_config(out_dir, run_config, "the finished run")
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
        _say(f"{out_dir} already holds this finished run; nothing to do")
        return TrainResult.from_manifest(out_dir, manifest)

    # Load the base model.
    if isinstance(model_spec, LoadedModel):
        loaded = model_spec
        spec_text = loaded.source
    else:
        from accelerate import PartialState

        assert base_spec is not None  # a LoadedModel base is trained as it was loaded
        spec_text = os.fspath(model_spec)
        with PartialState().main_process_first():  # one process converts an embedded model
            loaded = load_model(base_spec, allow_pickle=allow_pickle)
    model, tokenizer = loaded.model, loaded.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    run_config["base_model_sha256"] = loaded.weights_sha256
    resume_from = _check_out_dir(out_dir, resume, run_config)
    if _is_main_process():
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out_dir / RUN_CONFIG_NAME, run_config)

    set_seed(seed)
    untied = freeze_embeddings(model, embed=freeze_embed, unembed=freeze_unembed)
    if lora is not None:  # only the adapter trains; OUT becomes peft's adapter directory
        model = wrap_lora(model, lora)
    n_total, n_trainable = parameter_counts(model)

    train_ds = _TokenizedTexts(train_texts + supplemental, tokenizer, settings.max_length)
    val_ds = _TokenizedTexts(val_texts, tokenizer, settings.max_length)
    collator = _collator(tokenizer)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = settings.batch_size * settings.gradient_accumulation_steps * world
    steps_per_epoch = max(1, math.ceil(len(train_ds) / per_step))
    if settings.eval_steps is not None:
        strategy, every = "steps", settings.eval_steps
    elif max_steps is not None and max_steps < steps_per_epoch:
        strategy, every = "steps", max_steps
    else:
        strategy, every = "epoch", None
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
        eval_steps=every,
        save_steps=every,
        save_total_limit=1,
        load_best_model_at_end=settings.keep_best,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_strategy="steps",
        logging_steps=max(1, min(10, steps_per_epoch // 4 or 1)),
        train_sampling_strategy="group_by_length" if settings.group_by_length else "random",
        seed=seed,
        data_seed=seed,
        report_to="none",
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        prediction_loss_only=True,  # never gather [batch, tokens, vocab] logits
    )
    if save_every is not None:
        from weightgraft.training.trajectory import SnapshotCallback

        callbacks = [*(callbacks or []), SnapshotCallback(out_dir, save_every, tokenizer, data_root, split)]
    trainer = _trainer_class()(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=train_ds,
        eval_dataset=val_ds,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    _say(
        f"finetuning {spec_text} on split {split!r}: {len(train_texts)} train "
        f"(+{len(supplemental)} supplemental) / {len(val_texts)} validation examples, preset "
        f"{settings.name!r}, ~{total_steps} steps on {world} x {device}"
        f"{' (fp16)' if args.fp16 else ' (bf16)' if args.bf16 else ''}, "
        f"{n_trainable:,} of {n_total:,} parameters trainable"
    )

    before_file = out_dir / EVAL_BEFORE_NAME
    if resume_from is None:
        eval_before: float | None = float(trainer.evaluate()["eval_loss"])
        if trainer.is_world_process_zero():
            atomic.write_json(before_file, {"eval_loss_before": eval_before})
    else:
        _say(f"resuming from {resume_from}")
        eval_before = (
            json.loads(before_file.read_text())["eval_loss_before"]
            if before_file.is_file()
            else None
        )
    train_output = trainer.train(resume_from_checkpoint=resume_from)
    if settings.keep_best and trainer.state.best_metric is not None and trainer.state.best_model_checkpoint:
        final_eval = float(trainer.state.best_metric)  # the model now is that checkpoint's
    else:
        at_end = [h["eval_loss"] for h in trainer.state.log_history
                  if "eval_loss" in h and h.get("step") == trainer.state.global_step]
        # the last step's evaluation is of the model saved now; else evaluate it
        final_eval = float(at_end[-1]) if at_end else float(trainer.evaluate()["eval_loss"])

    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    train_loss = float(logged[-1]) if logged else float(train_output.training_loss)

    trainer.save_model(str(out_dir))  # safetensors + config + tokenizer, main process only
    if trainer.is_world_process_zero():
        # a pickle of TrainingArguments; the manifest records the settings instead
        (out_dir / "training_args.bin").unlink(missing_ok=True)
    result_hash = weights_sha256(trainer.model)
    by_template = loss_by_template(
        trainer.model, tokenizer, texts_by_template(train_records),
        max_length=settings.max_length,
    )
    manifest = {
        "format": "weightgraft-training-manifest/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base_model": {
            "spec": spec_text,
            "source": loaded.source,
            "weights_sha256": loaded.weights_sha256,
        },
        "data": {
            "dir": str(data_root),
            "manifest_sha256": run_config["data_manifest_sha256"],
            "train_sha256": run_config["train_sha256"],
            "validation_sha256": run_config["validation_sha256"],
            "split": split,
            "templates": templates,  # None: every training template
            "n_train": len(train_texts),
            "n_validation": len(val_texts),
            "supplemental": None
            if supplemental_path is None
            else {
                "path": str(supplemental_path),
                "sha256": run_config["supplemental_sha256"],
                "n": len(supplemental),
            },
        },
        "preset": settings.model_dump(),
        "seed": seed,
        "max_steps": max_steps,
        "freeze_embed": freeze_embed,
        "freeze_unembed": freeze_unembed,
        "untied_embeddings": untied,
        **({"lora": lora.model_dump()} if lora is not None else {}),
        **({"quantization": quantization} if quantization is not None else {}),
        "parameters": {"total": n_total, "trainable": n_trainable},
        "results": {
            "train_loss": train_loss,
            "train_loss_mean": float(train_output.training_loss),
            "eval_loss_before": eval_before,
            "eval_loss": final_eval,
            # the saved model on (up to 16 of) its training texts of each template
            "train_loss_by_template": by_template,
            "best_checkpoint": (
                Path(trainer.state.best_model_checkpoint).name
                if trainer.state.best_model_checkpoint
                else None
            ),
            "global_step": int(trainer.state.global_step),
            "epochs": float(trainer.state.epoch or 0.0),
            "resumed_from": Path(resume_from).name if resume_from else None,
            "seconds": round(time.time() - started, 1),
        },
        "model": {"weights_sha256": result_hash},
        "hardware": {"device": device, "world_size": world, "fp16": args.fp16, "bf16": args.bf16},
        "versions": {
            "python": platform.python_version(),
            "weightgraft": _version("weightgraft"),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "accelerate": _version("accelerate"),
        },
    }
    if trainer.is_world_process_zero():
        atomic.write_json(out_dir / LOG_NAME, trainer.state.log_history)
        atomic.write_json(out_dir / MANIFEST_NAME, manifest)  # marks a finished run
        if not keep_checkpoints:
            shutil.rmtree(out_dir / CHECKPOINTS, ignore_errors=True)
        shown = "?" if eval_before is None else f"{eval_before:.4f}"
        _say(
            f"saved {out_dir}: validation loss {shown} -> {final_eval:.4f}, "
            f"last train loss {train_loss:.4f}; on its training texts by template: "
            + ", ".join(f"{k} {v:.3f}" for k, v in by_template.items())
        )
        for name in unlearned_templates(by_template):
            _say(
                f"warning: the saved model has not learned template {name!r} (loss "
                f"{by_template[name]:.3f} on its training texts, far above the other "
                "templates): grafting results on it are not meaningful; train again (another "
                "seed, a decaying learning rate) before using this model"
            )
    return TrainResult.from_manifest(out_dir, manifest)
