"""``weightgraft run``: run or resume an experiment sweep."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def run(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. limit=20 models.sft=DIR"),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run (or resume) an experiment sweep; writes results.parquet, summary.csv, manifest.json."""
    from weightgraft.api.pipelines import run as run_sweep
    from weightgraft.experiments.config import load_config
    from weightgraft.report.console import print_summary

    cfg = load_config(config, overrides or [])
    result = run_sweep(cfg, progress=progress)  # and its report, as every pipeline's front door writes it
    if not result.is_main:  # other ranks of a torchrun / accelerate launch: rank 0 reports
        return
    print_summary(result.summary, protocol=cfg.protocol, title=f"{cfg.name}: {len(result.results)} rows")
    if result.exclusions["total"]:
        console.print(
            f"[yellow]{result.exclusions['total']} example(s) excluded from every scheme:[/] "
            f"{result.exclusions['by_reason']} (see {result.run_dir / 'exclusions.csv'})"
        )
    if result.report is not None:
        console.print(f"report: {result.report}")
    console.print(f"results in {result.run_dir}")
