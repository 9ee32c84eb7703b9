"""``weightgraft demo``: the whole workflow on the embedded model."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def demo(
    model: str = typer.Option("smollm2-135m", "--model", "-m",
                              help="Embedded model: smollm2-135m or gemma3-270m."),
    out: Path = typer.Option(None, help="Output directory (default runs/demo, or runs/demo-MODEL)."),
    relations: int = typer.Option(40, help="Relations in the demo world."),
    seed: int = typer.Option(0),
    preset: str | None = typer.Option(None, help="Finetuning preset (default: cpu-quick; cpu-lora with --lora)."),
    retrain: bool = typer.Option(False, help="Finetune again even if a cached model exists."),
    lora: int = typer.Option(None, "--lora", min=1, help="Finetune a LoRA adapter of this rank (the SFT "
                             "model is peft(pre, ADAPTER)); default output runs/demo-lora."),
    quantization: str = typer.Option(None, "--quantization", help="With --lora: load PRE quantized (nf4, fp4, "
                                     "int8, torchao-int8) and train the adapter over it (QLoRA); output "
                                     "runs/demo-lora-SCHEME."),
    experts: int = typer.Option(None, "--experts", min=2, help="Upcycle the model to a mixture of this many "
                                "experts (every expert a copy of its MLP, a fresh router) and end with the "
                                "finetune's expert map; output runs/demo-moeN."),
    top_k: int = typer.Option(2, "--top-k", min=2, help="With --experts: experts picked per position."),
) -> None:
    """The whole workflow on an embedded model (SmolLM2-135M by default, or Gemma 3 270M): data,
    finetune (cached), sweep, report."""
    from weightgraft.demo import check_demo_model, run_demo

    check_demo_model(model)  # a DemoError: one line, before anything is built
    if quantization is not None:
        from weightgraft.models.spec import quantized

        quantized(model, quantization)  # an unknown scheme: one line, before anything is built
    run_demo(model=model, out=out, n_relations=relations, seed=seed, preset=preset, retrain=retrain, console=console,
             lora=lora, quantization=quantization, experts=experts, top_k=top_k)


