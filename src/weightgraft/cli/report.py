"""``weightgraft report``: tables, figures and an HTML page for a run directory."""

from __future__ import annotations

from pathlib import Path

import typer


def report_command(
    run_dir: Path = typer.Argument(..., help="Run directory written by `weightgraft run` (holds results.parquet)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder.", show_default="RUN_DIR/report",
    ),
    max_examples: int = typer.Option(50, help="Per-example top-token tables per template in the HTML page."),
    k: int = typer.Option(5, "--k", help="Bar charts and grids show top-K accuracy (1, 5, 10, 20, 50 or 100)."),
) -> None:
    """Write tables, figures and a self-contained HTML report for a run directory."""
    from rich.console import Console
    from rich.markdown import Markdown

    from weightgraft.report import ReportError, write_report

    console = Console()
    try:
        paths = write_report(run_dir, out, max_examples=max_examples, k=k)
    except ReportError as err:
        raise typer.BadParameter(str(err), param_hint="RUN_DIR") from err
    console.print(Markdown(paths.summary_md.read_text(encoding="utf-8")))
    console.print(f"summary: {paths.summary_md}")
    console.print(f"report:  {paths.html}")
    console.print(f"figures: {len(paths.figures)} (PNG + SVG) in {paths.out_dir / 'figures'}")
