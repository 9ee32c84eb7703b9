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
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from weightgraft import atomic
from weightgraft.models import LoadedModel, weights_sha256
from weightgraft.resume.manifests import Json
from weightgraft.training import steps
from weightgraft.training.embeddings import freeze_embeddings
from weightgraft.training.lora import LoraSettings, parameter_counts, wrap_lora
from weightgraft.training.outputs import (
    CHECKPOINTS,
    LOG_NAME,
    MANIFEST_NAME,
    RUN_CONFIG_NAME,
    TrainingManifest,
    TrainResult,
    _check_out_dir,
    _compare_run_config,
    _is_main_process,
    _say,
)
from weightgraft.training.presets import TrainPreset
from weightgraft.training.steps import FinetuneOptions
from weightgraft.training.text_loss import loss_by_template, token_mean_loss, unlearned_templates
from weightgraft.training.texts import _collator, _TokenizedTexts, texts_by_template


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
    opts = FinetuneOptions(seed, freeze_embed, freeze_unembed, resume, supplemental_text, max_steps, keep_checkpoints,
                           allow_pickle, callbacks, templates, lora, quantization, device, save_every)
    return _finetune(model_spec, data_dir, split=split, preset=preset, out=out, opts=opts, overrides=overrides)


def _finetune(model_spec: str | os.PathLike[str] | LoadedModel, data_dir: str | os.PathLike[str], *, split: str,
              preset: str | os.PathLike[str] | TrainPreset, out: str | os.PathLike[str], opts: FinetuneOptions,
              overrides: Json) -> TrainResult:
    """``finetune`` as its steps: check -> read -> claim the folder -> load -> train -> measure -> record."""
    from transformers import set_seed

    started = time.time()
    out_dir = Path(out).expanduser().resolve()
    settings = steps.preset_settings(preset, overrides)
    opts = opts.checked(model_spec)
    base_spec = steps.base_spec(model_spec, opts)
    data = steps.read_data(Path(data_dir).expanduser().resolve(), split, settings, opts)
    run_config = steps.run_config(model_spec, data, split, settings, opts)
    if opts.resume and (out_dir / MANIFEST_NAME).is_file():
        _compare_run_config(out_dir, run_config, "the finished run")
        finished = json.loads((out_dir / MANIFEST_NAME).read_text())
        _say(f"{out_dir} already holds this finished run; nothing to do")
        return TrainResult.from_manifest(out_dir, finished)

    loaded, spec_text = steps.base_model(model_spec, base_spec, opts)
    model, tokenizer = loaded.model, loaded.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    run_config["base_model_sha256"] = loaded.weights_sha256
    resume_from = _check_out_dir(out_dir, opts.resume, run_config)
    if _is_main_process():
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out_dir / RUN_CONFIG_NAME, run_config)

    set_seed(opts.seed)
    untied = freeze_embeddings(model, embed=opts.freeze_embed, unembed=opts.freeze_unembed)
    if opts.lora is not None:  # only the adapter trains; OUT becomes peft's adapter directory
        model = wrap_lora(model, opts.lora)
    counts = parameter_counts(model)
    trainer, plan = _trainer(model, tokenizer, data, split, settings, out_dir, opts)
    _say(
        f"finetuning {spec_text} on split {split!r}: {len(data.train_texts)} train "
        f"(+{len(data.supplemental)} supplemental) / {len(data.val_texts)} validation examples, preset "
        f"{settings.name!r}, ~{plan.total_steps} steps on {plan.world} x {opts.device}"
        f"{' (fp16)' if plan.args.fp16 else ' (bf16)' if plan.args.bf16 else ''}, "
        f"{counts[1]:,} of {counts[0]:,} parameters trainable"
    )

    eval_before = steps.loss_before(trainer, out_dir, resume_from)
    train_output = trainer.train(resume_from_checkpoint=resume_from)
    final_eval = steps.final_loss(trainer, settings)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    train_loss = float(logged[-1]) if logged else float(train_output.training_loss)

    trainer.save_model(str(out_dir))  # safetensors + config + tokenizer, main process only
    if trainer.is_world_process_zero():
        # a pickle of TrainingArguments; the manifest records the settings instead
        (out_dir / "training_args.bin").unlink(missing_ok=True)
    weights = weights_sha256(trainer.model)
    by_template = loss_by_template(trainer.model, tokenizer, texts_by_template(data.train_records),
                                   max_length=settings.max_length)
    results = steps.results(trainer, train_output, train_loss=train_loss, eval_before=eval_before, final_eval=final_eval,
                            by_template=by_template, resume_from=resume_from, started=started)
    manifest = steps.manifest(loaded=loaded, spec_text=spec_text, data=data, config=run_config, split=split,
                              settings=settings, opts=opts, untied=untied, counts=counts, results=results,
                              weights=weights, args=plan.args, world=plan.world)
    if trainer.is_world_process_zero():
        _record(trainer, out_dir, manifest, opts)
    return TrainResult.from_manifest(out_dir, manifest)


def _trainer(model: Any, tokenizer: Any, data: steps.TrainingData, split: str, settings: TrainPreset, out_dir: Path,
             opts: FinetuneOptions) -> tuple[Any, steps.Schedule]:
    """The Trainer over the split's texts (and the supplemental text), with its schedule."""
    train_ds = _TokenizedTexts(data.train_texts + data.supplemental, tokenizer, settings.max_length)
    val_ds = _TokenizedTexts(data.val_texts, tokenizer, settings.max_length)
    collator = _collator(tokenizer)
    plan = steps.schedule(settings, out_dir, opts, len(train_ds))
    callbacks = opts.callbacks
    if opts.save_every is not None:
        from weightgraft.training.trajectory import SnapshotCallback

        callbacks = [*(callbacks or []), SnapshotCallback(out_dir, opts.save_every, tokenizer, data.root, split)]
    trainer = _trainer_class()(model=model, args=plan.args, data_collator=collator, train_dataset=train_ds,
                               eval_dataset=val_ds, processing_class=tokenizer, callbacks=callbacks)
    return trainer, plan


def _record(trainer: Any, out_dir: Path, manifest: TrainingManifest, opts: FinetuneOptions) -> None:
    """The finished run's log and manifest (the manifest marks it finished), the checkpoints
    removed unless kept, and the losses said, with a warning per template not learned."""
    atomic.write_json(out_dir / LOG_NAME, trainer.state.log_history)
    atomic.write_json(out_dir / MANIFEST_NAME, manifest)  # marks a finished run
    if not opts.keep_checkpoints:
        shutil.rmtree(out_dir / CHECKPOINTS, ignore_errors=True)
    results = manifest["results"]
    eval_before, final_eval, by_template = results["eval_loss_before"], results["eval_loss"], results["train_loss_by_template"]
    shown = "?" if eval_before is None else f"{eval_before:.4f}"
    _say(
        f"saved {out_dir}: validation loss {shown} -> {final_eval:.4f}, "
        f"last train loss {results['train_loss']:.4f}; on its training texts by template: "
        + ", ".join(f"{k} {v:.3f}" for k, v in by_template.items())
    )
    for name in unlearned_templates(by_template):
        _say(
            f"warning: the saved model has not learned template {name!r} (loss "
            f"{by_template[name]:.3f} on its training texts, far above the other "
            "templates): grafting results on it are not meaningful; train again (another "
            "seed, a decaying learning rate) before using this model"
        )
