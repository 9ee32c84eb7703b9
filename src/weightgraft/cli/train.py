"""The ``weightgraft train`` command (registered by ``weightgraft.cli``; also runnable as
``python -m weightgraft.cli.train``)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from weightgraft.errors import WeightgraftError
from weightgraft.training.presets import PRESETS

_err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long its path


class Split(str, Enum):
    """Which records of the data directory to train on."""

    relation = "relation"
    task = "task"
    both = "both"
    a2b = "a2b"
    b2a = "b2a"


_PRESET_HELP = (
    f"{' | '.join(PRESETS)}, or a .json/.yaml file of TrainPreset fields. paper-aggressive / "
    "paper-gentle: the paper's A.3.3 settings (gentle also needs --supplemental); cpu-quick: "
    "SmolLM2-135M learns the demo facts on a 2-core CPU (~8 minutes on the demo's 6 templates); "
    "cpu-gentle: cpu-quick with half its learning rate and general text (--supplemental)."
)


def train(
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="Base model: smollm2-135m | gemma3-270m (embedded), a model directory, a .gguf "
        "file, or a hub id already in the local HF cache.",
    ),
    data: Path = typer.Option(
        ..., "--data", help="Data directory from `weightgraft data build` (train.jsonl, ...)."
    ),
    split: Split = typer.Option(
        ...,
        "--split",
        help="both: all records (SFT); a2b / b2a: one direction (reversal); task / relation: "
        "records of that group, both directions (hybrid experiment).",
    ),
    preset: str = typer.Option(..., "--preset", help=_PRESET_HELP),
    out: Path = typer.Option(..., "--out", help="Output directory for the finetuned model."),
    seed: int = typer.Option(0, "--seed", help="Seed for data order and dropout."),
    freeze_embed: bool = typer.Option(
        False, "--freeze-embed", help="Keep the embedding matrix unchanged (unties if tied)."
    ),
    freeze_unembed: bool = typer.Option(
        False, "--freeze-unembed", help="Keep the unembedding matrix unchanged (unties if tied)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the last checkpoint in OUT (same settings)."
    ),
    supplemental: Optional[Path] = typer.Option(
        None,
        "--supplemental",
        help="General text added to training (required by paper-gentle and cpu-gentle): .jsonl "
        "with 'text', or one example per line; a recipe may take only its first texts.",
    ),
    max_steps: Optional[int] = typer.Option(
        None, "--max-steps", help="Stop after N optimizer steps."
    ),
    lr: Optional[float] = typer.Option(None, "--lr", help="Override the preset learning rate."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Override the preset epochs."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Override the preset per-device batch size."
    ),
    templates: Optional[str] = typer.Option(
        None, "--templates",
        help="Comma-separated training templates to train on (default: all; validation unchanged).",
    ),
    keep_checkpoints: bool = typer.Option(
        False, "--keep-checkpoints", help="Keep OUT/checkpoints after training."
    ),
    save_every: Optional[int] = typer.Option(
        None, "--save-every", min=1,
        help="Keep the model after step 1 and every N steps in OUT/trajectory/ (with each one's "
        "top-5 on the trained direction in OUT/trajectory.json): checkpoint donors for a trajectory sweep.",
    ),
    allow_pickle: bool = typer.Option(
        False, "--allow-pickle", help="Allow a pickle (.bin) base checkpoint (runs code on load)."
    ),
    lora: Optional[int] = typer.Option(
        None, "--lora", min=1,
        help="Train a LoRA adapter of this rank instead of the whole model: OUT is a peft adapter "
        "directory, a donor as peft(pre, OUT).",
    ),
    lora_targets: Optional[str] = typer.Option(
        None, "--lora-targets",
        help="Modules the adapter adapts, e.g. q_proj,v_proj (default: all-linear, every linear "
        "layer of the blocks).",
    ),
    quantization: Optional[str] = typer.Option(
        None, "--quantization",
        help="Load the base quantized (nf4, fp4, int8, torchao-int8) and train the LoRA adapter over it "
        "(QLoRA; needs --lora): the donor is peft(pre, OUT) with pre: quantized(MODEL, SCHEME).",
    ),
) -> None:
    """Finetune a pretrained model (PRE) into an SFT / task / relation model (HF Trainer)."""
    from weightgraft.training.lora import LoraSettings, parse_targets
    from weightgraft.training.trainer import finetune

    if lora_targets is not None and lora is None:
        _err.print("[bold red]error:[/] --lora-targets needs --lora RANK", highlight=False)
        raise typer.Exit(code=2)
    try:
        adapter = None if lora is None else LoraSettings(rank=lora, targets=parse_targets(lora_targets))
        result = finetune(
            model,
            data,
            split=split.value,
            preset=preset,
            out=out,
            seed=seed,
            freeze_embed=freeze_embed,
            freeze_unembed=freeze_unembed,
            resume=resume,
            supplemental_text=supplemental,
            max_steps=max_steps,
            keep_checkpoints=keep_checkpoints,
            allow_pickle=allow_pickle,
            learning_rate=lr,
            epochs=epochs,
            batch_size=batch_size,
            templates=[t.strip() for t in templates.split(",") if t.strip()] if templates else None,
            lora=adapter,
            quantization=quantization,
            save_every=save_every,
        )
    except WeightgraftError as exc:  # a training setting, a model, a spec or a scheme it cannot use
        _err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from exc
    r = result.manifest["results"]
    before = r.get("eval_loss_before")
    _err.print(
        f"[green]done[/] {result.out_dir}: validation loss "
        f"{'?' if before is None else f'{before:.4f}'} -> {r['eval_loss']:.4f} "
        f"({r['global_step']} steps, {r['seconds']:.0f} s)"
        + (f"; a LoRA adapter: use it as peft(pre, {result.out_dir})" if lora is not None else "")
        + (f" with pre: quantized({model}, {quantization})" if quantization is not None else ""),
        highlight=False,
    )


app = typer.Typer(add_completion=False, help="weightgraft training commands")


@app.callback()
def _main() -> None:
    """weightgraft training commands."""


app.command("train")(train)

if __name__ == "__main__":
    app()
