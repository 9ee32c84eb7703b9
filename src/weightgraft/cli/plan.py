"""``weightgraft plan``: memory and time of a run or localize config, before any weight is read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from weightgraft.planning.cards import CARDS
from weightgraft.planning.errors import PlanError
from weightgraft.planning.sizes import gib as _gib

console = Console()


def _seconds(s: float | None) -> str:
    if s is None:
        return "not predicted"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def plan(
    config: Path = typer.Argument(..., help="Experiment or localize YAML."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. dtype=bfloat16 limit=50"),
    memory: Optional[str] = typer.Option(None, "--memory", help="Plan for this much memory (e.g. 80GiB) "
                                         "instead of this device's free memory."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Plan for one GPU of this kind (its memory and "
                                      "stated rates): " + ", ".join(CARDS) + "."),
    disk_gbps: Optional[float] = typer.Option(None, "--disk-gbps", help="With --gpu: the read rate of the disk "
                                              "the weights come from, in GB/s (default: 2, a stated assumption)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    time: bool = typer.Option(True, "--time/--no-time", help="Predict the wall time (calibrates this "
                              "device once, a few seconds, cached; with --gpu: the card's stated rates)."),
) -> None:
    """Plan a run or localize config: memory per role and per batch, batch size, predicted time."""
    from weightgraft.configfile import read_yaml_config
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.plan import plan_experiment
    from weightgraft.planning.cards import card
    from weightgraft.planning.sizes import parse_size

    if memory is not None:
        parse_size(memory)  # a bad size is one line, before anything else
    chosen = card(gpu) if gpu is not None else None
    if disk_gbps is not None:
        if chosen is None or disk_gbps <= 0:
            raise PlanError("--disk-gbps needs --gpu CARD and a rate above 0 (GB/s of the disk the weights come from)")
        chosen = replace(chosen, disk_bytes_per_second=disk_gbps * 1e9)
    raw = read_yaml_config(config, overrides or [], "experiment or localize")
    if isinstance(raw, dict) and "schemes" not in raw:
        from weightgraft.localization.claims.evidence import claims_notes
        from weightgraft.localization.config import parse_localize_config
        from weightgraft.localization.run import plan_input
        from weightgraft.planning.localize import plan_localize_work

        localize_config = parse_localize_config(raw, str(config))
        result = plan_localize_work(plan_input(localize_config), memory=memory, gpu=chosen, with_time=time)
        result.notes.extend(claims_notes(localize_config))
    else:
        result = plan_experiment(parse_config(raw, str(config)), memory=memory, gpu=chosen, with_time=time)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), default=str))
        return
    table = Table(title=f"{result.kind} plan: {config} ({result.device}, {result.dtype})")
    for col in ("set", "role", "model", "parameters", "holds", "memory"):
        table.add_column(col)
    for r in result.roles:
        table.add_row(r.model_set, r.role, r.spec, f"{r.n_params / 1e9:.3f} B", r.holds, _gib(r.held_bytes))
    console.print(table)
    p = result.prompts
    console.print(f"prompts: {p['n']}, {p['min_tokens']}-{p['max_tokens']} tokens (mean {p['mean_tokens']}); "
                  f"{p['counted']}")
    console.print(f"rows: {result.rows} in {result.batches} batch(es) of {result.batch_size} "
                  f"({'fixed by the config' if result.batch_size_fixed else 'chosen by the plan'})")
    for k, v in result.memory.items():
        console.print(f"  {k:>35}: {_gib(v)}")
    verdict = "[green]fits[/]" if result.fits else "[red]does NOT fit[/]"
    console.print(f"peak: {_gib(result.peak_bytes)} of {_gib(result.budget_bytes)} ({result.budget_source}): {verdict}")
    parts = ", ".join(f"{k} {_seconds(v)}" for k, v in result.time_parts.items())
    console.print(f"predicted time: {_seconds(result.predicted_seconds)}" + (f" ({parts})" if parts else ""))
    for note in result.notes:
        console.print(f"note: {note}")
    if not result.fits:
        console.print(f"[red]{result.refusal()}[/]")
        raise typer.Exit(1)
