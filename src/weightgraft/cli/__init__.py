"""The ``weightgraft`` command: every subcommand registered in one place."""

from __future__ import annotations

import typer
from rich.console import Console

from weightgraft.cli.check import check
from weightgraft.cli.data import app as data_app
from weightgraft.cli.demo import demo
from weightgraft.cli.experts import experts
from weightgraft.cli.explore import explore
from weightgraft.cli.generate import generate
from weightgraft.cli.localize import localize
from weightgraft.cli.paper import paper
from weightgraft.cli.plan import plan
from weightgraft.cli.report import report_command
from weightgraft.cli.run import run
from weightgraft.cli.train import train
from weightgraft.cli.upcycle import upcycle

app = typer.Typer(
    help="Exact, fast dynamic weight grafting for HF decoder language models.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        from weightgraft import __version__

        typer.echo(f"weightgraft {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit.",
    ),
) -> None:
    """Exact, fast dynamic weight grafting for HF decoder language models."""


app.command()(check)
app.command()(run)
app.command()(demo)
app.command()(localize)
app.command("plan", help="Memory and time of a run or localize config, before any weight is read.")(plan)
app.command("generate", help="Continue prompts with a grafted model.")(generate)
app.command("report", help="Write tables, figures and an HTML page for a run directory.")(report_command)
app.command("train", help="Finetune a model (HF Trainer) on a dataset's training text.")(train)
app.command("paper", help="The paper's experiments on one model, the paper's numbers beside ours.")(paper)
app.command("experts", help="Which experts carry a finetune's effect: an exact expert map of a mixture of experts.")(experts)
app.command("explore", help="A local web page: paint a graft, watch the answer move.")(explore)
app.command("upcycle", help="Make a dense Llama/Mistral model a mixture of experts (sparse upcycling).")(upcycle)
app.add_typer(data_app, name="data", help="Build relation datasets (worlds, templates, test prompts).")


def main() -> None:
    """Entry point. An error of the user's input (a ``WeightgraftError``, an OSError naming a
    path) prints one line; anything else is a bug in weightgraft and prints its traceback and
    a line that says so (set WEIGHTGRAFT_DEBUG=1 for the traceback of every error)."""
    import os

    from weightgraft.errors import WeightgraftError
    from weightgraft.runtime import apply_thread_default

    apply_thread_default()  # before torch's thread pool starts; the user's OMP_NUM_THREADS wins
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        Console(stderr=True, soft_wrap=True).print(
            "interrupted: the rows saved so far are kept; the same command resumes from them")
        raise SystemExit(130) from None
    except Exception as exc:  # noqa: BLE001 - every error ends here: one line or a bug report
        if os.environ.get("WEIGHTGRAFT_DEBUG"):
            raise
        if isinstance(exc, WeightgraftError) or (isinstance(exc, OSError) and exc.filename is not None):
            _one_line(exc)
            raise SystemExit(2) from None
        _bug(exc)
        raise SystemExit(1) from None


def _one_line(exc: BaseException) -> None:
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(f'{type(exc).__name__}: {exc}')}")


def _bug(exc: BaseException) -> None:
    """The traceback, then one line: not the user's mistake, and which version to name."""
    import traceback

    from rich.markup import escape

    from weightgraft import __version__

    traceback.print_exception(exc)
    Console(stderr=True, soft_wrap=True).print(
        f"[red]internal error:[/] {escape(f'{type(exc).__name__}: {exc}')}\n"
        f"This is a bug in weightgraft {__version__}, not in your input: please report it with the "
        f"traceback above and the command you ran."
    )


if __name__ == "__main__":
    main()
