"""The ``weightgraft`` command."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Exact, fast dynamic weight grafting for HF decoder language models.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
console = Console()


@app.callback()
def _root() -> None:
    """Exact, fast dynamic weight grafting for HF decoder language models."""


def _dtype(name: str):
    import torch

    table = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}
    if name not in table:
        raise typer.BadParameter(f"dtype must be one of {', '.join(table)}")
    return table[name]


@app.command()
def check(
    base: str = typer.Argument(..., help="Base model: directory, .gguf file or embedded name."),
    donor: list[str] = typer.Argument(..., help="One or more donor models (same architecture)."),
    prompts: Path | None = typer.Option(None, help="Text file, one prompt per line."),
    maps: int = typer.Option(2, help="Random source maps of each kind to check."),
    seed: int = typer.Option(0),
    atol: Optional[float] = typer.Option(None, help="Absolute tolerance on logits (default: per dtype, see weightgraft.check.ORACLE_TOLERANCE)."),
    rtol: Optional[float] = typer.Option(None, help="Tolerance relative to the largest |logit| (default: per dtype)."),
    dtype: str = typer.Option(
        "float64",
        help="float64 (default: rounding is then ~1e-13, so any real difference stands out) | "
        "float32 | bfloat16 | float16 (the engine as you run it; tolerances per dtype)",
    ),
    device: str = typer.Option("cpu"),
    allow_pickle: bool = typer.Option(False, help="Allow pickle (.bin) checkpoints."),
) -> None:
    """Check the fast engine against the per-token KV-cache definition on YOUR models."""
    from weightgraft.check import DEFAULT_PROMPTS, check_engine
    from weightgraft.models import load_model
    from weightgraft.tokenization import batch_encode, check_same_tokenizer

    loaded = [
        load_model(spec, device=device, dtype=_dtype(dtype), allow_pickle=allow_pickle)
        for spec in [base, *donor]
    ]
    for other in loaded[1:]:
        check_same_tokenizer(loaded[0].tokenizer, other.tokenizer, other.source)
    if prompts is not None:
        texts = [t for t in prompts.read_text(encoding="utf-8").splitlines() if t.strip()]
        if not texts:
            raise typer.BadParameter(f"{prompts} holds no prompt")
    else:
        texts = list(DEFAULT_PROMPTS)
    input_ids, mask = batch_encode(loaded[0].tokenizer, texts, device=device)
    with console.status("running the per-token reference and the engine..."):
        report = check_engine(
            [lm.model for lm in loaded], input_ids, mask,
            n_random=maps, seed=seed, atol=atol, rtol=rtol,
        )
    table = Table(title=f"engine vs per-token definition ({len(texts)} prompts)")
    for col in ("source map", "max |Δ logit|", "max |logit|", "top-1 agree", "result"):
        table.add_column(col)
    for case in report.cases:
        ok = report.passed_case(case)
        table.add_row(
            case.name, f"{case.max_abs_diff:.2e}", f"{case.logit_scale:.1f}",
            f"{case.top1_agree:.0%}", "[green]pass[/]" if ok else "[red]FAIL[/]",
        )
    console.print(table)
    verdict = "PASS" if report.passed else "FAIL"
    console.print(f"{verdict}: max |Δ logit| = {report.max_abs_diff:.3e} (atol {report.atol}, rtol {report.rtol})")
    raise typer.Exit(0 if report.passed else 1)


def print_summary(summary, title: str = "summary") -> None:
    """The summary as a rich table: top-1 / top-5 (%) and mean rank per template and scheme."""
    table = Table(title=title)
    for col in ("model set", "template", "scheme", "n", "top-1 %", "top-5 %", "mean rank"):
        table.add_column(col, justify="right" if col in ("n", "top-1 %", "top-5 %", "mean rank") else "left")
    for row in summary.to_dict("records"):
        table.add_row(
            row["model_set"], row["template"], row["scheme"], str(row["n"]),
            f"{100 * row['top1']:.1f}", f"{100 * row['top5']:.1f}", f"{row['mean_rank']:.1f}",
        )
    console.print(table)


@app.command()
def run(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. limit=20 models.sft=DIR"),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run (or resume) an experiment sweep; writes results.parquet, summary.csv, manifest.json."""
    from weightgraft.config import load_config
    from weightgraft.runner import run_experiment

    cfg = load_config(config, overrides or [])
    result = run_experiment(cfg, progress=progress)
    if not result.is_main:  # other ranks of a torchrun / accelerate launch: rank 0 reports
        return
    print_summary(result.summary, title=f"{cfg.name}: {len(result.results)} rows")
    if result.exclusions["total"]:
        console.print(
            f"[yellow]{result.exclusions['total']} example(s) excluded from every scheme:[/] "
            f"{result.exclusions['by_reason']} (see {result.run_dir / 'exclusions.csv'})"
        )
    if cfg.report:
        from weightgraft.report import write_report

        paths = write_report(result.run_dir)
        console.print(f"report: {paths.html}")
    console.print(f"results in {result.run_dir}")


@app.command()
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


def _register_subcommands() -> None:
    from weightgraft.data.cli import app as data_app
    from weightgraft.report import report_command
    from weightgraft.training_cli import train

    app.add_typer(data_app, name="data", help="Build relation datasets (worlds, templates, test prompts).")

    app.command("report", help="Write tables, figures and an HTML page for a run directory.")(report_command)
    app.command("train", help="Finetune a model (HF Trainer) on a dataset's training text.")(train)


_register_subcommands()


def main() -> None:
    """Entry point: known user errors print one clear line instead of a traceback
    (set WEIGHTGRAFT_DEBUG=1 for the traceback)."""
    import os

    try:
        app(standalone_mode=True)
    except (ValueError, RuntimeError, FileNotFoundError, TypeError) as exc:
        if os.environ.get("WEIGHTGRAFT_DEBUG"):
            raise
        Console(stderr=True).print(f"[red]error:[/] {type(exc).__name__}: {exc}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
