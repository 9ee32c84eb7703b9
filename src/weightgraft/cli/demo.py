"""``weightgraft demo``: the whole workflow on the embedded model."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def demo(
    out: Path = typer.Option(Path("runs/demo"), help="Output directory."),
    relations: int = typer.Option(40, help="Relations in the demo world."),
    seed: int = typer.Option(0),
    preset: str = typer.Option("cpu-quick", help="Finetuning preset."),
    retrain: bool = typer.Option(False, help="Finetune again even if a cached model exists."),
) -> None:
    """The whole workflow on the embedded SmolLM2-135M: data, finetune (cached), sweep, report."""
    from weightgraft.demo import run_demo

    run_demo(out=out, n_relations=relations, seed=seed, preset=preset, retrain=retrain, console=console)


