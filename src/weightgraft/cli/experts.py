"""``weightgraft experts``: the expert map of a mixture-of-experts finetune (and of its control),
exact cell by cell, at the first entity and the last token."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def experts(
    pre: str = typer.Option(..., "--pre", help="The base model (PRE): a folder or any model spec."),
    sft: str = typer.Option(..., "--sft", help="The finetune whose experts are mapped."),
    control: Optional[list[str]] = typer.Option(None, "--control", help="A control finetune (answers shuffled), "
                                                "mapped in the same cells; repeat for several."),
    data: Path = typer.Option(..., "--data", help="The data folder (`weightgraft data build`) of the test prompts."),
    out: Path = typer.Option(Path("runs/experts"), "--out", help="Output folder (tables, expert_cells.parquet, report/index.html)."),
    template: Optional[list[str]] = typer.Option(None, "--template", help="Test templates (default: paper_headline "
                                                 "and paper_qa); repeat for several."),
    direction: str = typer.Option("a2b", help="The prompts' direction (the finetune's trained one)."),
    prompts: Optional[int] = typer.Option(None, min=3, help="At most this many prompts per template."),
    metric: str = typer.Option("fact_logprob", help="The effect's metric (fact_logprob: the answer against the "
                               "world's other answers; first_logprob: the answer's log-probability)."),
    top: int = typer.Option(10, min=1, help="Cells shown per template and region."),
) -> None:
    """Which experts carry a finetune's effect: every expert the router picks at the first entity's
    tokens and the last token, grafted alone from the finetune into PRE (exact), with the control
    finetune's effect in the same cells and the region grafts (experts, router alone, both, all)."""
    from weightgraft.expert_maps.prepare import prepare

    job = prepare(pre=pre, donors={"sft": sft, **{f"control[{i}]" if len(control or []) > 1 else "control": c
                                                  for i, c in enumerate(control or [])}},
                  data=data, out=out, templates=tuple(template or ("paper_headline", "paper_qa")), direction=direction,
                  prompts=prompts, metric=metric, say=console.print)
    tables = job.run()
    show = tables["top_cells"].groupby(["template", "region"], sort=False).head(top)
    table = Table(title=f"expert cells of largest mean effect ({metric}, sufficiency: one expert of SFT into PRE)")
    for col in ("template", "region", "layer", "expert", "pick_rate", "effect", "ci_low", "ci_high"):
        table.add_column(col)
    beside = [c for c in show.columns if c.startswith("effect[")]
    for col in beside:
        table.add_column(col)
    for _, r in show.iterrows():
        table.add_row(r["template"], r["region"], str(r["layer"]), str(r["expert"]), f"{r['pick_rate']:.2f}",
                      f"{r['effect']:.3f}", f"{r['ci_low']:.3f}", f"{r['ci_high']:.3f}", *(f"{r[c]:.3f}" for c in beside))
    console.print(table)
    regions = tables["regions"]
    console.print(regions.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    console.print(f"tables: {out}/top_cells.csv, experts.csv, concentration.csv, regions.csv; cells: {out}/expert_cells.parquet")
    from weightgraft.report.experts import write_experts_report  # matplotlib: only once the map is written

    console.print(f"report: {write_experts_report(out)} (again: weightgraft report {out})")
