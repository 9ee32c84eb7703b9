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

import copy
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from weightgraft.models import LoadedModel, load_model, weights_sha256

__all__ = [
    "PRESETS",
    "SPLITS",
    "TrainPreset",
    "TrainResult",
    "TrainingError",
    "finetune",
    "freeze_embeddings",
    "get_preset",
    "read_split",
    "untie_embeddings",
]

SPLITS: tuple[str, ...] = ("relation", "task", "both", "a2b", "b2a")
MANIFEST_NAME = "training_manifest.json"
RUN_CONFIG_NAME = "training_run.json"
CHECKPOINTS = "checkpoints"
EVAL_BEFORE_NAME = "training_eval_before.json"
LOG_NAME = "training_log.json"


class TrainingError(ValueError):
    """Bad training input (data directory, split, preset, output directory). The message says
    what is wrong and how to fix it."""


# --------------------------------------------------------------------------------------
# Presets: data, validated by a pydantic model
# --------------------------------------------------------------------------------------


class TrainPreset(BaseModel):
    """Hyperparameters of one finetuning recipe (AdamW; per-device batch size)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    learning_rate: float = Field(gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    batch_size: int = Field(default=4, ge=1, description="per device")
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    epochs: float = Field(default=10.0, gt=0)
    lr_scheduler: Literal[
        "linear", "constant", "constant_with_warmup", "cosine", "cosine_with_min_lr"
    ] = "linear"
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    max_grad_norm: float = Field(default=1.0, gt=0)
    gpu_precision: Literal["fp32", "fp16", "bf16"] = Field(
        default="fp32", description="mixed precision on a GPU; CPU runs are always fp32"
    )
    max_length: int = Field(default=256, ge=8, description="tokens per example (truncated)")
    group_by_length: bool = Field(
        default=False, description="batch examples of similar length (less padding)"
    )
    eval_steps: int | None = Field(
        default=None, ge=1, description="evaluate + checkpoint every N steps; None: each epoch"
    )
    requires_supplemental: bool = Field(
        default=False, description="needs general text besides the facts (supplemental_text)"
    )


_PRESET_DATA: list[dict[str, Any]] = [
    {
        "name": "paper-aggressive",
        "description": "Paper A.3.3 'aggressive': AdamW lr 2e-5 linear, wd 0.01, batch 4, "
        "10 epochs, fp16 on GPU, best checkpoint by validation loss.",
        "learning_rate": 2e-5,
        "weight_decay": 0.01,
        "batch_size": 4,
        "epochs": 10,
        "lr_scheduler": "linear",
        "gpu_precision": "fp16",
    },
    {
        "name": "paper-gentle",
        "description": "Paper A.3.3 'less aggressive': lr 2e-6 linear, no weight decay, batch "
        "4, 10 epochs, fp16 on GPU, plus general text you supply (--supplemental FILE).",
        "learning_rate": 2e-6,
        "weight_decay": 0.0,
        "batch_size": 4,
        "epochs": 10,
        "lr_scheduler": "linear",
        "gpu_precision": "fp16",
        "requires_supplemental": True,
    },
    {
        "name": "cpu-quick",
        # Measured on the demo data (40 relations, split a2b, 360 examples, 2 CPU cores):
        # 6.5 min, headline top-5 0% -> 97.5%. 2 epochs: 82.5%; lr 3e-4 x 2 epochs: 77.5%.
        "description": "Smallest recipe that teaches SmolLM2-135M the 40 demo relations on 2 "
        "CPU cores in ~7 minutes: lr 2e-4 constant, batch 8, 3 epochs, length-grouped batches.",
        "learning_rate": 2e-4,
        "weight_decay": 0.0,
        "batch_size": 8,
        "epochs": 3,
        "lr_scheduler": "constant",
        "group_by_length": True,
    },
]

PRESETS: dict[str, TrainPreset] = {
    d["name"]: TrainPreset.model_validate(d) for d in _PRESET_DATA
}


def get_preset(name_or_path: str | os.PathLike[str], **overrides: Any) -> TrainPreset:
    """A preset by name (:data:`PRESETS`) or from a JSON/YAML file, with fields overridden.

    Raises:
        TrainingError: unknown name, unreadable file, or invalid fields.
    """
    key = os.fspath(name_or_path)
    if key in PRESETS:
        base = PRESETS[key].model_dump()
    else:
        path = Path(key).expanduser()
        if not path.is_file():
            raise TrainingError(
                f"unknown preset {key!r}: use one of {', '.join(PRESETS)} or a .json/.yaml "
                "file with the fields of weightgraft.training.TrainPreset"
            )
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                base = yaml.safe_load(path.read_text())
            else:
                base = json.loads(path.read_text())
        except Exception as exc:
            raise TrainingError(f"cannot read preset file {path}: {exc}") from exc
        if not isinstance(base, dict):
            raise TrainingError(f"preset file {path} must hold a mapping of fields")
        base.setdefault("name", path.stem)
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return TrainPreset.model_validate({**base, **clean})
    except ValidationError as exc:
        fields = ", ".join(TrainPreset.model_fields)
        raise TrainingError(
            f"invalid preset settings for {key!r}: {exc}\nfields: {fields}"
        ) from exc


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise TrainingError(
            f"{path} not found: a data directory holds train.jsonl, validation.jsonl and "
            "manifest.json (build one with `weightgraft data build`)"
        )
    records = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainingError(f"{path}:{number}: not valid JSON ({exc})") from exc
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise TrainingError(f"{path}:{number}: expected an object with a string 'text'")
            records.append(record)
    return records


def _keep(record: dict[str, Any], split: str, path: Path) -> bool:
    if split == "both":
        return True
    field = "direction" if split in ("a2b", "b2a") else "group"
    if field not in record:
        raise TrainingError(
            f"{path}: a record has no '{field}' field, needed for split {split!r} "
            f"(record: {json.dumps(record)[:200]})"
        )
    return record[field] == split


def read_split(data_dir: str | os.PathLike[str], split: str) -> tuple[list[str], list[str]]:
    """Texts of the train and validation records of ``split`` (see the module docstring)."""
    if split not in SPLITS:
        raise TrainingError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    root = Path(data_dir)
    if not root.is_dir():
        raise TrainingError(f"data directory {root} does not exist")
    out: list[list[str]] = []
    for name in ("train.jsonl", "validation.jsonl"):
        path = root / name
        records = _read_jsonl(path)
        kept = [r["text"] for r in records if _keep(r, split, path)]
        if not kept:
            groups = sorted({str(r.get("group")) for r in records})
            directions = sorted({str(r.get("direction")) for r in records})
            raise TrainingError(
                f"{path}: no records for split {split!r} ({len(records)} records; groups "
                f"{groups}, directions {directions})"
            )
        out.append(kept)
    return out[0], out[1]


def _read_supplemental(path: Path) -> list[str]:
    """General text: a .jsonl with a 'text' field per line, or plain text, one example a line."""
    if not path.is_file():
        raise TrainingError(f"supplemental text file {path} not found")
    if path.suffix.lower() == ".jsonl":
        texts = [r["text"] for r in _read_jsonl(path)]
    else:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        texts = [t for t in texts if t]
    if not texts:
        raise TrainingError(f"supplemental text file {path} holds no text")
    return texts


class _TokenizedTexts(torch.utils.data.Dataset):
    """Texts tokenized for causal LM training: labels = input ids (padding masked later)."""

    def __init__(self, texts: list[str], tokenizer: Any, max_length: int) -> None:
        self.items: list[dict[str, list[int]]] = []
        eos = tokenizer.eos_token_id
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
            if eos is not None and (not ids or ids[-1] != eos) and len(ids) < max_length:
                ids = ids + [eos]  # teach where an example ends
            self.items.append(
                {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)}
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.items[index]


def _trainer_class() -> type:
    """The HF Trainer, with a length-grouped sampler that is seeded per epoch.

    transformers' ``LengthGroupedSampler`` draws from the global RNG, so a run resumed in the
    middle of an epoch would see a different order than the uninterrupted run. Seeding it with
    ``data_seed + epoch`` (the Trainer calls ``set_epoch`` every epoch, on every process) makes
    the order a function of the epoch only: resumed runs match, and all data-parallel
    processes agree.
    """
    from transformers import Trainer
    from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices

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

    return _Trainer


def _collator(tokenizer: Any) -> Any:
    """Pads a batch on the right; labels are the input ids with padding set to -100 (so the
    loss covers every text token and the closing EOS, even when the pad token is the EOS)."""
    from transformers import DataCollatorForSeq2Seq

    right = copy.copy(tokenizer)
    right.padding_side = "right"  # positions stay 0..n-1 without position_ids
    return DataCollatorForSeq2Seq(right, padding=True, label_pad_token_id=-100, return_tensors="pt")


# --------------------------------------------------------------------------------------
# Embeddings: untie, freeze
# --------------------------------------------------------------------------------------


def _configs(model: Any) -> list[Any]:
    configs = [model.config]
    text = model.config.get_text_config()
    if text is not model.config:
        configs.append(text)
    return configs


def untie_embeddings(model: Any) -> bool:
    """Give the unembedding its own copy of a tied embedding matrix. Returns whether it was tied.

    Afterwards ``config.tie_word_embeddings`` is False, so the model saves and reloads with
    two separate matrices (equal at first), and freezing or grafting one leaves the other alone.
    """
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if out is None or getattr(out, "weight", None) is None:
        return False
    if out.weight is not inp.weight and out.weight.data_ptr() != inp.weight.data_ptr():
        return False
    out.weight = torch.nn.Parameter(
        inp.weight.detach().clone(), requires_grad=inp.weight.requires_grad
    )
    for cfg in _configs(model):
        cfg.tie_word_embeddings = False
    if hasattr(model, "get_expanded_tied_weights_keys"):  # transformers >= 5
        model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)
    return True


def freeze_embeddings(model: Any, *, embed: bool, unembed: bool) -> bool:
    """Freeze the embedding and/or unembedding matrix (``requires_grad=False``).

    If they are tied and only one is to be frozen, they are untied first
    (:func:`untie_embeddings`). Returns whether the model was untied.
    """
    untied = False
    if embed != unembed:
        untied = untie_embeddings(model)
    if embed:
        model.get_input_embeddings().weight.requires_grad_(False)
    if unembed:
        out = model.get_output_embeddings()
        if out is None:
            raise TrainingError("this model has no output embedding (unembedding) to freeze")
        out.weight.requires_grad_(False)
        if getattr(out, "bias", None) is not None:
            out.bias.requires_grad_(False)
    return untied


# --------------------------------------------------------------------------------------
# Finetuning
# --------------------------------------------------------------------------------------


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
    """

    out_dir: Path
    manifest: dict[str, Any]
    train_loss: float | None
    eval_loss: float | None
    eval_loss_before: float | None
    weights_sha256: str

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


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


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
    **overrides: Any,
) -> TrainResult:
    """Finetune a causal LM on one split of a relation dataset with the HF Trainer.

    Args:
        model_spec: anything :func:`weightgraft.models.load_model` takes, or a
            :class:`LoadedModel` (trained in place).
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
            raise TrainingError(f"invalid preset overrides: {exc}") from exc
    else:
        settings = get_preset(preset, **overrides)
    if max_steps is not None and max_steps < 1:
        raise TrainingError("max_steps must be at least 1")

    train_texts, val_texts = read_split(data_root, split)
    supplemental: list[str] = []
    supplemental_path = None
    if supplemental_text is not None:
        supplemental_path = Path(supplemental_text).expanduser().resolve()
        supplemental = _read_supplemental(supplemental_path)
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

        spec_text = os.fspath(model_spec)
        with PartialState().main_process_first():  # one process converts an embedded model
            loaded = load_model(spec_text, allow_pickle=allow_pickle)
    model, tokenizer = loaded.model, loaded.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    run_config["base_model_sha256"] = loaded.weights_sha256
    resume_from = _check_out_dir(out_dir, resume, run_config)
    if _is_main_process():
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(out_dir / RUN_CONFIG_NAME, run_config)

    set_seed(seed)
    untied = freeze_embeddings(model, embed=freeze_embed, unembed=freeze_unembed)
    n_total = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    train_ds = _TokenizedTexts(train_texts + supplemental, tokenizer, settings.max_length)
    val_ds = _TokenizedTexts(val_texts, tokenizer, settings.max_length)
    collator = _collator(tokenizer)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = settings.batch_size * settings.gradient_accumulation_steps * world
    steps_per_epoch = max(1, math.ceil(len(train_ds) / per_step))
    on_gpu = torch.cuda.is_available()
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
        fp16=on_gpu and settings.gpu_precision == "fp16",
        bf16=on_gpu and settings.gpu_precision == "bf16",
        eval_strategy=strategy,
        save_strategy=strategy,
        eval_steps=every,
        save_steps=every,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_strategy="steps",
        logging_steps=max(1, min(10, steps_per_epoch // 4 or 1)),
        train_sampling_strategy="group_by_length" if settings.group_by_length else "random",
        seed=seed,
        data_seed=seed,
        report_to="none",
        use_cpu=not on_gpu,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        prediction_loss_only=True,  # never gather [batch, tokens, vocab] logits
    )
    trainer = _trainer_class()(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=train_ds,
        eval_dataset=val_ds,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    device = "cuda" if on_gpu else "cpu"
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
            _write_json_atomic(before_file, {"eval_loss_before": eval_before})
    else:
        _say(f"resuming from {resume_from}")
        eval_before = (
            json.loads(before_file.read_text())["eval_loss_before"]
            if before_file.is_file()
            else None
        )
    train_output = trainer.train(resume_from_checkpoint=resume_from)
    if trainer.state.best_metric is not None and trainer.state.best_model_checkpoint:
        final_eval = float(trainer.state.best_metric)  # the model now is that checkpoint's
    else:  # no evaluation happened during training
        final_eval = float(trainer.evaluate()["eval_loss"])

    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    train_loss = float(logged[-1]) if logged else float(train_output.training_loss)

    trainer.save_model(str(out_dir))  # safetensors + config + tokenizer, main process only
    if trainer.is_world_process_zero():
        # a pickle of TrainingArguments; the manifest records the settings instead
        (out_dir / "training_args.bin").unlink(missing_ok=True)
    result_hash = weights_sha256(trainer.model)
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
        "parameters": {"total": n_total, "trainable": n_trainable},
        "results": {
            "train_loss": train_loss,
            "train_loss_mean": float(train_output.training_loss),
            "eval_loss_before": eval_before,
            "eval_loss": final_eval,
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
        _write_json_atomic(out_dir / LOG_NAME, trainer.state.log_history)
        _write_json_atomic(out_dir / MANIFEST_NAME, manifest)  # marks a finished run
        if not keep_checkpoints:
            shutil.rmtree(out_dir / CHECKPOINTS, ignore_errors=True)
        shown = "?" if eval_before is None else f"{eval_before:.4f}"
        _say(
            f"saved {out_dir}: validation loss {shown} -> {final_eval:.4f}, "
            f"last train loss {train_loss:.4f}"
        )
    return TrainResult.from_manifest(out_dir, manifest)
