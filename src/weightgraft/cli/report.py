"""``weightgraft report``: tables, figures and an HTML page for a run directory."""

from __future__ import annotations

from pathlib import Path

import typer


def report_command(
    run_dir: Path = typer.Argument(..., help="Run directory written by `weightgraft run` (holds results.parquet), "
                                   "or an output folder of `weightgraft experts`."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder.", show_default="RUN_DIR/report",
    ),
    max_examples: int = typer.Option(50, help="Per-example top-token tables per template in the HTML page."),
    k: int = typer.Option(5, "--k", help="Bar charts and grids show top-K accuracy (1, 5, 10, 20, 50 or 100)."),
) -> None:
    """Write tables, figures and a self-contained HTML report for a run directory (or an expert
    map's folder: its own page, told apart by its manifest's format)."""
    from rich.console import Console
    from rich.markdown import Markdown

    from weightgraft.report import ReportError, write_report
    from weightgraft.report.experts import is_experts_folder, write_experts_report

    console = Console()
    if is_experts_folder(run_dir):
        try:
            page = write_experts_report(run_dir, out)
        except ReportError as err:
            raise typer.BadParameter(str(err), param_hint="RUN_DIR") from err
        console.print(f"report:  {page}")
        console.print(f"figures: {len(list(page.parent.glob('experts_*.png')))} (PNG) in {page.parent}")
        return
    try:
        paths = write_report(run_dir, out, max_examples=max_examples, k=k)
    except ReportError as err:
        raise typer.BadParameter(str(err), param_hint="RUN_DIR") from err
    console.print(Markdown(paths.summary_md.read_text(encoding="utf-8")))
    console.print(f"summary: {paths.summary_md}")
    console.print(f"report:  {paths.html}")
    console.print(f"figures: {len(paths.figures)} (PNG + SVG) in {paths.out_dir / 'figures'}")
