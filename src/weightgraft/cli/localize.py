"""``weightgraft localize``: cell maps and minimal graft sets of a model pair on a dataset."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def localize(
    config: Path = typer.Argument(..., help="Localize YAML (data, models.pre, models.sft, ...)."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. limit=5 exact=none"),
    progress: bool = typer.Option(True, help="Print each stage as it finishes."),
) -> None:
    """Localize a finetuned behaviour cell by cell: attribution and exact maps, minimal sets."""
    from weightgraft.experiments.localize import load_localize_config
    from weightgraft.experiments.localize import localize as run_localize

    cfg = load_localize_config(config, overrides or [])
    result = run_localize(cfg, progress=progress)
    for entry in result.search.get("searches", []):
        console.print(f"{entry['direction']:>11} / {entry['template']}: {entry['size']} cells carry "
                      f"{entry['share']:.0%} of the effect" + ("" if entry["reached"] else " (target not reached)"))
    if result.excluded:
        console.print(f"[yellow]{len(result.excluded)} prompt(s) excluded[/] (answer tokenizes to nothing)")
    console.print(f"cells: {result.run_dir / 'cells.parquet'}\nreport: {result.run_dir / 'report' / 'index.html'}")
