"""Finetuning recipes (the paper's and a CPU one), validated by a pydantic model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from weightgraft.errors import validation_line
from weightgraft.resume.manifests import Json
from weightgraft.training.errors import TrainingError


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
    supplemental_examples: int | Literal["facts"] | None = Field(
        default=None,
        description="general texts mixed in: the file's first N (refused if it holds fewer); "
        "'facts': as many as the fact texts trained on (the paper's ratio: 10,000 beside just "
        "under 10,000); None: the whole file",
    )

    @field_validator("supplemental_examples")
    @classmethod
    def _positive(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("a number of general texts is at least 1")
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Json:
        # left out at its default, so a recipe's dump (finetune keys, training folders) is what it
        # was before the field existed
        data: Json = handler(self)
        if self.supplemental_examples is None:
            data.pop("supplemental_examples", None)
        return data

    def supplemental_count(self, n_facts: int, n_file: int) -> int:
        """How many of a file's ``n_file`` general texts this recipe mixes in beside ``n_facts``
        fact texts (refused where the file holds fewer than it takes)."""
        want = n_facts if self.supplemental_examples == "facts" else self.supplemental_examples
        if want is None:
            return n_file
        if n_file < want:
            raise TrainingError(f"preset {self.name!r} mixes in {want:,} general texts "
                                f"({'as many as the facts' if self.supplemental_examples == 'facts' else 'supplemental_examples'}); "
                                f"the supplemental file holds {n_file:,}")
        return want
    keep_best: bool = Field(
        default=True,
        description="end on the checkpoint with the lowest validation loss (else the last one)",
    )


_CPU_QUICK = TrainPreset(
    name="cpu-quick",
    # Measured on the demo data (40 relations, split a2b, 6 renderings of each fact, 2 CPU
    # cores; docs/paper.md). A constant learning rate left the last model at the mercy of
    # its last updates: one 2-thread run ended with the "Q: ... A: ..." texts at loss 5
    # (QA top-5 0%) while the articles sat at 0.2. Decaying to 0 makes the last steps small.
    description="Smallest recipe that teaches SmolLM2-135M the 40 demo relations on 2 "
    "CPU cores: lr 3e-4 with 5% warmup and linear decay, batch 8, 4 epochs, "
    "length-grouped batches, the last checkpoint kept (~8 minutes on the demo's 6 "
    "renderings of each fact).",
    learning_rate=3e-4,
    weight_decay=0.0,
    batch_size=8,
    epochs=4,
    lr_scheduler="linear",
    warmup_ratio=0.05,
    # The validation loss (held-out rephrasings) rises while the facts are still being
    # learned, so "best" picked epoch 2 or 3 depending on rounding: the last is kept.
    keep_best=False,
    group_by_length=True,
)

_PRESET_LIST: tuple[TrainPreset, ...] = (
    TrainPreset(
        name="paper-aggressive",
        description="Paper A.3.3 'aggressive': AdamW lr 2e-5 linear, wd 0.01, batch 4, "
        "10 epochs, fp16 on GPU, best checkpoint by validation loss.",
        learning_rate=2e-5,
        weight_decay=0.01,
        batch_size=4,
        epochs=10,
        lr_scheduler="linear",
        gpu_precision="fp16",
    ),
    TrainPreset(
        name="paper-gentle",
        description="Paper A.3.3 'less aggressive': lr 2e-6 linear, no weight decay, batch "
        "4, 10 epochs, fp16 on GPU, plus general text you supply (--supplemental FILE).",
        learning_rate=2e-6,
        weight_decay=0.0,
        batch_size=4,
        epochs=10,
        lr_scheduler="linear",
        gpu_precision="fp16",
        requires_supplemental=True,
    ),
    _CPU_QUICK,
    _CPU_QUICK.model_copy(update=dict(
        name="cpu-gentle",
        # paper-gentle is paper-aggressive with a tenth of the learning rate, no weight decay and
        # general text as large as the facts. cpu-quick is already about the least that teaches the
        # demo facts: with the general text mixed in, a tenth of its rate (3e-5) left SmolLM2-135M at
        # headline / QA top-5 17.5% / 15% on the a2b facts, a third (1e-4) at 87.5% / 100%, both
        # below the finetune's 90% precondition (docs/paper.md); this takes half.
        description="A less aggressive cpu-quick, as paper-gentle is of paper-aggressive: half its "
        "learning rate (1.5e-4; a tenth and a third did not teach SmolLM2-135M the demo facts to 90%), "
        "no weight decay, and general text you supply (--supplemental FILE), as many texts as the "
        "facts trained on (the paper's ratio).",
        learning_rate=_CPU_QUICK.learning_rate / 2,
        requires_supplemental=True,
        supplemental_examples="facts",
    )),
    _CPU_QUICK.model_copy(update=dict(
        name="cpu-lora",
        # Measured on the demo data (SmolLM2-135M, rank 8 on every linear layer, nf4 base, 2 CPU
        # cores; docs/big-models.md): cpu-quick's lr 3e-4 x 4 epochs left the adapter at headline /
        # QA top-5 5% / 7.5%, lr 2e-3 x 4 epochs at 32.5% / 45%; lr 3e-3 x 8 epochs reaches 100% / 100%.
        description="cpu-quick for a LoRA adapter (--lora, QLoRA too): an adapter of rank 8 needs a "
        "larger step and more passes than full finetuning to learn the 40 demo relations: lr 3e-3 "
        "with 5% warmup and linear decay, batch 8, 8 epochs, length-grouped, the last checkpoint kept "
        "(~18 minutes for QLoRA on 2 CPU cores).",
        learning_rate=3e-3,
        epochs=8,
    )),
)

PRESETS: dict[str, TrainPreset] = {preset.name: preset for preset in _PRESET_LIST}


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
        raise TrainingError(f"invalid preset settings for {key!r}: {validation_line(exc)} (fields: {fields})") from None
