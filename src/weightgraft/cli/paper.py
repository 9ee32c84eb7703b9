"""``weightgraft paper``: the paper's experiments on one model, the paper's numbers beside ours."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from weightgraft.paper.settings import PaperSettings

console = Console()


def _seconds(s: float | None) -> str:
    if s is None:
        return "not predicted"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def paper(
    model: str = typer.Option(..., "--model", "-m", help="The pretrained model (PRE): a folder, an embedded name "
                              "(smollm2-135m) or a cached hub id."),
    world: str = typer.Option("fake_movies_real_actors", help="The paper's world (the appendix: fake_movies_fake_actors, "
                              "real_movies_real_actors_shuffled)."),
    worlds: Optional[str] = typer.Option(None, "--worlds", help="The paper's appendix in the same command: 'all' runs "
                                         "the appendix worlds (Figs. 10-12), each a run of its own in OUT/worlds/WORLD, "
                                         "and Fig. 13's less aggressive finetune (the position_gentle sweep); or a "
                                         "comma-separated list of worlds."),
    gentle_preset: Optional[str] = typer.Option(None, help="Fig. 13's recipe (App. C.4), general text mixed in. "
                                                "Default: paper-gentle (lr 2e-6, no weight decay, 10,000 texts) "
                                                "with --preset paper-aggressive, else cpu-gentle (cpu-quick with a "
                                                "half its learning rate, as many texts as facts)."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or mps."),
    out: Path = typer.Option(Path("runs/paper"), help="Output folder: every stage in a folder keyed by its inputs, "
                             "and paper.md / paper.html."),
    plan: bool = typer.Option(False, "--plan", help="Print every stage with its planned time and memory; run nothing."),
    relations: int = typer.Option(40, help="Relations in the world."),
    seed: int = typer.Option(0, help="The world's seed (and the sweeps')."),
    train_seed: int = typer.Option(0, help="The finetunes' (first) training seed."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Training seeds K: every finetune role is trained with seeds "
                              "train-seed .. train-seed+K-1 and every figure's sweep runs on each seed's finetunes "
                              "(the claims on each seed's a2b finetune); the report gives each row's values across "
                              "the seeds and says where a verdict differs between them. A finished seed is reused."),
    preset: str = typer.Option("cpu-quick", help="Finetuning preset (paper-aggressive on a GPU)."),
    max_steps: Optional[int] = typer.Option(None, min=1, help="Stop each finetune after this many steps."),
    batch_size: Optional[int] = typer.Option(None, min=1, help="Sweep batch size (default: the plan's)."),
    sweeps: Optional[str] = typer.Option(None, help="Comma-separated sweeps to run (default: all but "
                                         "position_gentle): position, component, component_reversal, hybrid, "
                                         "position_spans, lm_head, layer_dropout, position_gentle (Fig. 13)."),
    claims: bool = typer.Option(True, help="Judge the paper's claims (exact region grafts against their nulls, "
                                "weightgraft localize) on the a2b and both-directions finetunes, each fact claim also "
                                "against the control finetune (the a2b recipe on the same texts with the answers "
                                "shuffled among the subjects, trained for it)."),
    margin: float = typer.Option(10.0, min=0.0, help="Equivalence margin in points, fixed before the run: on the "
                                 "paper's own model a stated number is `same model: equivalent` where our 90% "
                                 "interval lies within it +- this."),
    paper_model: Optional[str] = typer.Option(None, "--paper-model", help="The paper's model this run's model is "
                                              "(gemma-1.1-2b-it, gpt2-xl, Llama-3.2-1B, pythia-2.8b), so its stated "
                                              "numbers are tested for equivalence; default: read off the model "
                                              "spec's last path part, and any other model is compared in shape "
                                              "only."),
    trajectory: Optional[int] = typer.Option(None, "--trajectory", min=1, help="Ours, not the paper's: the a2b "
                                             "finetune keeps its model every N steps, and FE, LT, FE+LT and its "
                                             "complement are grafted from each snapshot (top-5 and fact log-prob "
                                             "by step in the report)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="With --plan: plan for one GPU of this kind (h100-80gb, "
                                      "h200-141gb, ...; its memory and stated rates), here or not; the model may then "
                                      "be a random: config of the paper's shapes (nothing trains)."),
) -> None:
    """data -> finetunes (each checked against its precondition) -> every figure's sweep -> the
    paper's claims against their nulls -> one report with the paper's numbers beside ours. A
    stopped run resumes: finished stages are reused, keyed by their inputs."""
    from weightgraft.paper.appendix import world_names
    from weightgraft.paper.figures import DEFAULT_SWEEPS, SWEEP_NAMES
    from weightgraft.paper.pipeline import PaperSettings, run_paper

    settings = PaperSettings(
        model=model, world=world, relations=relations, seed=seed, train_seed=train_seed, seeds=seeds, device=device,
        out=out, preset=preset, max_steps=max_steps, batch_size=batch_size, progress=progress, claims=claims,
        margin=margin, paper_model=paper_model, trajectory=trajectory, gentle_preset=gentle_preset,
        worlds=world_names(worlds) if worlds else (),
        sweeps=tuple(s.strip() for s in sweeps.split(",") if s.strip()) if sweeps else
        (SWEEP_NAMES if worlds else DEFAULT_SWEEPS),
    )
    if gpu is not None and not plan:
        console.print("[bold red]error:[/] --gpu plans for a card: use it with --plan", highlight=False)
        raise typer.Exit(code=2)
    if plan:
        _print_plan(settings, gpu)
        return
    run_paper(settings, console=console)


def _print_plan(settings: PaperSettings, gpu: str | None = None) -> None:
    from weightgraft.paper.plan import plan_paper
    from weightgraft.planning.cards import card
    from weightgraft.planning.sizes import gib

    chosen = card(gpu) if gpu is not None else None
    stages = plan_paper(settings, gpu=chosen)
    where = f"one {chosen.name} ({chosen.label})" if chosen is not None else settings.device
    seeds = f", {settings.seeds} training seeds" if settings.seeds > 1 else ""
    table = Table(title=f"weightgraft paper plan ({where}{seeds})")
    for col in ("stage", "what", "time", "memory", "status", "counts"):
        table.add_column(col)
    notes: dict[str, None] = {}
    for s in stages:
        notes.update(dict.fromkeys(s.notes))
        table.add_row(s.stage, s.what, _seconds(s.seconds), gib(s.memory_bytes) if s.memory_bytes else "",
                      "done (reused)" if s.done else "to run", s.counts)
    console.print(table)
    for note in notes:
        console.print(f"note: {note}", highlight=False)
    todo = [s.seconds for s in stages if not s.done]
    total = None if any(t is None for t in todo) else sum(t for t in todo if t is not None)
    console.print(f"predicted time of the stages to run: {_seconds(total)}")
