"""``weightgraft data``: build relation datasets from the command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from weightgraft.data.builder import build_dataset
from weightgraft.data.errors import DataError
from weightgraft.data.templates import builtin_template_names
from weightgraft.data.worlds import WORLDS

app = typer.Typer(
    help="Relation datasets: the paper's movie worlds, templates and test prompts.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _data() -> None:
    """Relation datasets: the paper's movie worlds, templates and test prompts."""


class _RichProgress:
    """Adapter from the builder's ``progress(stage, done, total)`` calls to a rich bar."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)


def _split_names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _refuse_out(out: Path, force: bool) -> str | None:
    """A dataset never overwrites a file, nor (without --force) a folder that holds something."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file; give a folder for the dataset"
    if out.is_dir() and any(out.iterdir()) and not force:
        return f"--out {out} is not empty; pass --force to overwrite its dataset files, or choose another folder"
    return None


@app.command()
def build(
    out: Path = typer.Option(..., "--out", help="Directory to write the dataset into."),
    world: str | None = typer.Option(
        None,
        "--world",
        help=f"Built-in world ({', '.join(WORLDS)}) or a name for a custom world.",
        show_default="fake_movies_real_actors, or 'custom' with --metadata",
    ),
    n: int | None = typer.Option(
        None, "--n", help="Number of relations.", show_default="1000; all rows of --metadata"
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of every random draw."),
    metadata: Path | None = typer.Option(
        None, "--metadata", help="Custom metadata JSONL (one relation per line)."
    ),
    templates: str | None = typer.Option(
        None,
        "--templates",
        help=f"Template YAML file or built-in set ({', '.join(builtin_template_names())}).",
    ),
    directions: str = typer.Option("both", "--directions", help="Training text: a2b, b2a or both."),
    test_directions: str = typer.Option(
        "both", "--test-directions", help="Test prompts: a2b, b2a or both."
    ),
    relation_fraction: float = typer.Option(
        0.5, "--relation-fraction", help="Fraction of relations in group 'relation' (rest: 'task')."
    ),
    validation_templates: str | None = typer.Option(
        None,
        "--validation-templates",
        help="Comma-separated training templates held out for validation.",
        show_default="the YAML's",
    ),
    shuffle_answers: bool = typer.Option(
        False,
        "--shuffle-answers",
        help="Training text names another relation's answer entity (seeded by --seed; a null "
        "finetune). Test prompts keep the true answers.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success."),
    force: bool = typer.Option(False, "--force", help="Overwrite the files of a non-empty --out folder."),
) -> None:
    """Build a dataset: metadata, train / validation text, test prompts and a manifest."""
    err = Console(stderr=True, soft_wrap=True)
    problem = _refuse_out(out, force) or (
        "--metadata needs --templates (a template YAML file or a built-in set) to turn its rows into prompts"
        if metadata is not None and templates is None and world is None else None
    )
    if problem:
        err.print(f"[bold red]error:[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2)
    name = world or ("custom" if metadata is not None else "fake_movies_real_actors")
    start = time.perf_counter()
    show = not quiet and sys.stderr.isatty()
    try:
        with Progress(
            TextColumn("{task.description:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
            disable=not show,
        ) as bar:
            ds = build_dataset(
                name,
                n,
                seed,
                out,
                directions=directions,
                test_directions=test_directions,
                relation_fraction=relation_fraction,
                metadata=metadata,
                templates=templates,
                validation_templates=_split_names(validation_templates),
                shuffled_answers=shuffle_answers,
                progress=_RichProgress(bar) if show else None,
            )
    except DataError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(code=2) from None
    if not quiet:
        c = ds.manifest["counts"]
        shuffled = " (shuffled answers)" if shuffle_answers else ""
        Console().print(
            f"{name}{shuffled}: {c['relations']} relations, {c['train']} train lines, "
            f"{c['validation']} validation lines, {c['test_prompts']} test prompts "
            f"-> {out} ({time.perf_counter() - start:.1f} s)",
            highlight=False,
        )


@app.command("counterfact")
def counterfact(
    file: Path = typer.Argument(..., help="CounterFact records: JSON, JSONL or parquet (ROME's or the flat layout)."),
    out: Path = typer.Option(..., "--out", help="Directory to write test_prompts.jsonl (and training texts) into."),
    answer: str = typer.Option("new", "--answer", help="new: the counterfact is the answer, the true object the distractor; true: the reverse."),
    train_texts: bool = typer.Option(False, "--train-texts", help="Also write train.jsonl / validation.jsonl (prompt + answer) for `weightgraft train`."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Convert only the first N records."),
) -> None:
    """Convert CounterFact records into test prompts (subject span, answer, distractor)."""
    from weightgraft.data.counterfact import convert
    from weightgraft.data.prompts import DatasetError

    try:
        counts = convert(file, out, answer, train_texts, limit)  # type: ignore[arg-type]
    except DatasetError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(code=2) from None
    extra = f", {counts['train']} training texts" if "train" in counts else ""
    Console().print(f"{counts['test_prompts']} test prompts{extra} -> {out}", highlight=False)


@app.command("worlds")
def worlds() -> None:
    """List the built-in worlds."""
    console = Console()
    for w in WORLDS.values():
        limit = w.max_n()
        console.print(
            f"{w.name}: {w.description} (templates: {w.templates}; "
            f"max n: {'no fixed limit' if limit is None else limit})",
            highlight=False,
        )
