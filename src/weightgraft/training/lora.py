"""LoRA finetuning (``weightgraft train --lora RANK``): peft wraps the base model, the Trainer
trains only the adapter, and the output directory is peft's adapter directory, which a config
names as ``peft(pre, DIR)`` (weightgraft.models.peft_donor) with no merge."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from weightgraft.errors import validation_line
from weightgraft.training.errors import TrainingError

ALL_LINEAR = "all-linear"  # peft's name for every linear layer of the blocks (not the unembedding)


class LoraSettings(BaseModel):
    """The adapter: rank, scaling and which modules it adapts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=1)
    alpha: float | None = None  # default 2 x rank
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # module names as peft takes them (q_proj, o_proj, ...), or "all-linear"
    targets: list[str] | str = ALL_LINEAR

    def __init__(self, **data: Any) -> None:
        """Bad settings (``rank=0``) are a ``TrainingError`` in one line, not pydantic's text."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise TrainingError(f"LoRA settings: {validation_line(exc)}") from None


def parse_targets(text: str | None) -> list[str] | str:
    """``--lora-targets q_proj,o_proj`` (or ``all-linear``, the default)."""
    if text is None or text.strip() == ALL_LINEAR:
        return ALL_LINEAR
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise TrainingError("--lora-targets names no module; give e.g. q_proj,v_proj or all-linear")
    return names


def wrap_lora(model: Any, settings: LoraSettings) -> Any:
    """The model with a fresh LoRA adapter; a target it does not have is one line."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha if settings.alpha is not None else 2 * settings.rank,
        lora_dropout=settings.dropout, target_modules=settings.targets, bias="none", task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise TrainingError(f"--lora-targets {settings.targets}: {exc}") from None


def parameter_counts(model: Any) -> tuple[int, int]:
    """(all, trainable) parameters, counted as the model has them: a bitsandbytes 4-bit weight
    (``Params4bit``, QLoRA's base) stores two weights a byte, so it counts as its logical shape
    (``quant_state.shape``), not as its packed storage."""
    total = trainable = 0
    for p in model.parameters():
        state = getattr(p, "quant_state", None)
        n = math.prod(state.shape) if state is not None else p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable
