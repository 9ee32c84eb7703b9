"""``weightgraft paper``: the paper's experiments on one model, as resumable stages.

data (the paper's world, seeded; for the claims also the same world with the answers shuffled
among the subjects) -> finetunes (a2b SFT, both directions, task, relation, and the control: the
a2b recipe on the shuffled texts; each checked against its precondition after training) -> every
figure's sweep (the authors' protocol; a sweep whose finetune misses its precondition is not run
and its figures are marked ``precondition not met``) -> the paper's claims judged against their
nulls and the control -> one report (markdown and HTML, with the figures drawn as PNG) with the
paper's numbers beside ours. With ``seeds`` K > 1 every finetune role is trained with K training
seeds and every sweep runs on each seed's finetunes (the claims on each seed's a2b finetune), so
the report gives each row's spread across seeds. Every stage's folder is keyed by its inputs
(:mod:`weightgraft.paper.stages`): a stopped run resumes, a changed input starts new folders.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from weightgraft.data import build_dataset
from weightgraft.data.worlds import get_world
from weightgraft.devices import require_device
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.models.spec import parse_spec
from weightgraft.paper.appendix import appendix_settings, run_general_text
from weightgraft.paper.claims import CLAIM_FINETUNES, run_claims
from weightgraft.paper.figures import (
    FINETUNES,
    SWEEP_NAMES,
    Finetune,
    Sweep,
    check_config,
    sweep_config,
    sweeps_for,
)
from weightgraft.paper.measured import drop_rows, summary_rows
from weightgraft.paper.numbers import PAPER_MODELS
from weightgraft.paper.report import write_paper_report
from weightgraft.paper.settings import (
    CHECK_TEMPLATES,
    PaperError,
    PaperRun,
    PaperSettings,
    SeedRecords,
    precondition,
    seed_label,
)
from weightgraft.paper.stages import (
    Check,
    DataOutputs,
    DataRecord,
    FinetuneOutputs,
    FinetuneRecord,
    GeneralTextRecord,
    Stage,
    SweepOutputs,
    SweepRecord,
    file_digest,
    stage_path,
)
from weightgraft.paper.trajectory import run_trajectory
from weightgraft.training import finetune as train
from weightgraft.training import get_preset
from weightgraft.training.device import training_device

__all__ = ["PaperError", "PaperRun", "PaperSettings", "SeedRecords", "check_inputs", "precondition", "run_paper"]

def check_inputs(settings: PaperSettings, planning_for: Any = None) -> None:
    """Refuse, in one line and before anything is built, an unknown world, a model spec that
    names no model (or one without a tokenizer), a device that is absent, an unknown preset or
    sweep. ``planning_for`` (a card): only planned, so a ``random:`` model (shapes only) and a
    device that is not here are accepted."""

    get_world(settings.world)
    for world in settings.worlds:
        get_world(world)
        if world == settings.world:
            raise PaperError(f"--worlds {world}: it is the run's own world (--world); name the others")
    if settings.paper_model is not None and settings.paper_model not in PAPER_MODELS:
        raise PaperError(f"paper_model {settings.paper_model!r}: the paper's models are {', '.join(PAPER_MODELS)}")
    unknown = sorted(set(settings.sweeps) - set(SWEEP_NAMES))
    if unknown or not settings.sweeps:
        raise PaperError(f"unknown sweep(s) {unknown}: choose among {', '.join(SWEEP_NAMES)}")
    if settings.relations < 4:
        raise PaperError(f"--relations {settings.relations}: the pipeline needs at least 4 (task and relation groups)")
    model = parse_spec(settings.model)
    if not model.has_tokenizer and planning_for is None:
        raise PaperError(f"--model {settings.model!r} has no tokenizer, so it cannot be finetuned; give a model "
                         "directory, an embedded name (smollm2-135m) or a cached hub id")
    model.check("--model")
    if planning_for is None:
        require_device(settings.device, PaperError, "--device ")  # the one device check
        training_device(settings.device)  # the finetunes' (cuda:N with N > 0: one line)
    get_preset(settings.preset)
    get_preset(settings.gentle_recipe)


def planned_sweeps(settings: PaperSettings) -> list[Sweep]:
    return [s for s in sweeps_for(settings.world) if s.name in settings.sweeps]


def needed_finetunes(settings: PaperSettings) -> list[Finetune]:
    names = dict.fromkeys([f for s in planned_sweeps(settings) for f in s.finetunes]
                          + (list(CLAIM_FINETUNES) if settings.claims else []))
    return [FINETUNES[n] for n in names]


def data_stage(settings: PaperSettings, shuffled: bool = False) -> Stage[DataOutputs]:
    """The world's data stage; ``shuffled``: the same world and seed with each relation's answer
    taken from another relation in the training texts (the control finetune's data)."""
    inputs: dict[str, Any] = {"world": settings.world, "relations": settings.relations, "seed": settings.seed}
    if shuffled:
        return Stage("data", f"{settings.world}-shuffled-answers", {**inputs, "shuffled_answers": True}, settings.out,
                     DataOutputs)
    return Stage("data", settings.world, inputs, settings.out, DataOutputs)


def run_data(settings: PaperSettings, console: Console, shuffled: bool = False) -> tuple[DataRecord, bool]:
    """The paper's world, built with its seed (``weightgraft.data.build_dataset``); ``shuffled``:
    its training texts with the answers shuffled among the subjects, test prompts unchanged."""

    stage = data_stage(settings, shuffled)
    done = stage.finished()
    if done is not None:
        return done, True
    started = time.time()
    console.rule(f"data: {settings.world}, {settings.relations} relations, seed {settings.seed}"
                 + (", answers shuffled among the subjects" if shuffled else ""))
    if stage.folder.exists():  # a stopped build: building again is cheap
        shutil.rmtree(stage.folder)
    build_dataset(settings.world, n=settings.relations, seed=settings.seed, out=stage.folder / "data",
                  shuffled_answers=shuffled)
    digest = file_digest(stage.folder / "data" / "manifest.json")
    return stage.finish(DataOutputs(dir="data", sha256=digest), time.time() - started), False


def finetune_stage(settings: PaperSettings, finetune: Finetune, data: DataRecord,
                   seed: int | None = None, general: GeneralTextRecord | None = None) -> Stage[FinetuneOutputs]:
    """The finetune's stage, keyed by its inputs: ``seed`` the training seed (None: the first,
    ``train_seed``), so each seed's finetune has folders of its own and the first seed's key is
    the same whatever ``seeds`` is; ``general``: the general text a gentle finetune mixes in."""

    return Stage("finetune", finetune.name, {
        "model": settings.model, "data": data.key, "split": finetune.split,
        "preset": get_preset(settings.preset_of(finetune)).model_dump(mode="json"),
        **({"supplemental": general.key} if finetune.gentle and general is not None else {}),
        "seed": settings.train_seed if seed is None else seed,
        "templates": list(settings.train_templates) if settings.train_templates is not None else None,
        "max_steps": settings.max_steps, "device": settings.device,
        **({"save_every": settings.trajectory} if _snapshots(settings, finetune) else {}),
        "check": {"templates": list(CHECK_TEMPLATES), "directions": list(finetune.directions),
                  "groups": list(finetune.groups) if finetune.groups else None},
    }, settings.out, FinetuneOutputs)



def _snapshots(settings: PaperSettings, finetune: Finetune) -> bool:
    """Whether this finetune keeps snapshots (``--trajectory``: the a2b finetune only)."""
    return settings.trajectory is not None and finetune.name == "a2b"


def run_finetune(settings: PaperSettings, finetune: Finetune, data: DataRecord, console: Console,
                 seed: int | None = None, general: GeneralTextRecord | None = None) -> tuple[FinetuneRecord, bool]:
    """Finetune the model on ``finetune.split`` of ``data`` (``weightgraft.training.finetune``,
    resumed from its checkpoints after a stop) with the training seed ``seed`` (None:
    ``train_seed``), then measure its precondition: the plain finetune's top-5 on the world's
    facts (the test prompts' true answers) per test sentence and direction (a sweep of its
    ``SFT`` baseline). The control is this with the shuffled data."""

    seed = settings.train_seed if seed is None else seed
    stage = finetune_stage(settings, finetune, data, seed, general)
    done = stage.finished()
    if done is not None:
        return done, True
    started = time.time()
    data_dir = stage_path(data, settings.out, "dir")
    model_dir = stage.folder / "model"
    console.rule(f"finetune {finetune.name}: split {finetune.split}, preset {settings.preset_of(finetune)}, training seed "
                 f"{seed} -> {stage.folder}")
    supplemental = stage_path(general, settings.out, "file") if finetune.gentle and general is not None else None
    train(settings.model, data_dir, split=finetune.split, preset=settings.preset_of(finetune), out=model_dir,
          supplemental_text=supplemental,
          seed=seed, resume=True,
          templates=list(settings.train_templates) if settings.train_templates is not None else None,
          max_steps=settings.max_steps, device=settings.device,
          save_every=settings.trajectory if _snapshots(settings, finetune) else None)
    trained = time.time() - started
    console.print(f"precondition of {finetune.name} (training seed {seed}): top-5 of the finetune on its own facts")
    raw = check_config(finetune, str(model_dir.resolve()), str(data_dir), CHECK_TEMPLATES, device=settings.device,
                       seed=settings.seed, batch_size=settings.batch_size)
    result = run_experiment(parse_config({**raw, "out": str(stage.folder / "check")}), progress=settings.progress)
    checks = [Check(template=str(r.template), direction=str(r.direction), top5=float(r.top5), n=int(r.n))
              for r in result.summary.itertuples()]
    record = stage.finish(FinetuneOutputs(model="model", checks=checks, train_seconds=round(trained, 1)),
                          time.time() - started)
    ok, line = precondition(settings, finetune, record)
    console.print(f"{line}: precondition {'met' if ok else 'NOT met'}", highlight=False)
    return record, False


def sweep_stage(settings: PaperSettings, sweep: Sweep, data: DataRecord,
                finetunes: dict[str, FinetuneRecord]) -> tuple[Stage[SweepOutputs], dict[str, Any]]:
    """The sweep's stage (keyed by its config with every model named by what made it: the base
    spec, or a finetune's stage key) and its raw config to run."""
    keyed = {role: settings.model if src == "base" else f"finetune:{finetunes[src].key}"
             for role, src in sweep.roles.items()}
    paths = {role: settings.model if src == "base" else str(stage_path(finetunes[src], settings.out, "model"))
             for role, src in sweep.roles.items()}
    common: dict[str, Any] = {"device": settings.device, "seed": settings.seed, "batch_size": settings.batch_size}
    stage = Stage("sweep", sweep.name, {"config": sweep_config(sweep, keyed, f"data:{data.key}", **common)},
                  settings.out, SweepOutputs)
    return stage, sweep_config(sweep, paths, str(stage_path(data, settings.out, "dir")), **common)


def run_sweep(settings: PaperSettings, sweep: Sweep, data: DataRecord, finetunes: dict[str, FinetuneRecord],
              console: Console) -> tuple[SweepRecord, bool]:
    """The sweep (``weightgraft.experiments.run_experiment``, which resumes from its saved rows),
    and its summary in ``stage.json``: what the report reads."""
    import pandas as pd

    stage, raw = sweep_stage(settings, sweep, data, finetunes)
    done = stage.finished()
    if done is not None:
        drops = done.outputs.drops if done.outputs.drops is not None else [{}] if sweep.drops else []
        if all("table" in d for d in drops):
            return done, True
        # finished before its drops (with their prompts' table) were kept: read them off its rows
        results = pd.read_parquet(stage.folder / done.outputs.run / "results.parquet")
        return stage.finish(done.outputs.updated(drops=drop_rows(sweep, results)), done.seconds), True
    started = time.time()
    console.rule(f"sweep {sweep.name}: {sweep.label}")
    result = run_experiment(parse_config({**raw, "out": str(stage.folder / "run")}), progress=settings.progress)
    outputs = SweepOutputs(run="run", summary=summary_rows(result.summary), drops=drop_rows(sweep, result.results))
    return stage.finish(outputs, time.time() - started), False


def run_seed(settings: PaperSettings, run: PaperRun, seed: int, records: SeedRecords, console: Console,
             after_stage: Callable[[str, str], None] | None = None) -> None:
    """One training seed's finetunes (each checked against its precondition) and every
    figure's sweep on them, into ``records``; a sweep whose finetune misses its precondition on
    this seed is not run on it, and ``records.skipped`` says why."""
    label = seed_label(settings, seed)
    for finetune in needed_finetunes(settings):
        source = run.shuffled_data if finetune.shuffled and run.shuffled_data is not None else run.data
        records.finetunes[finetune.name], reused = run_finetune(settings, finetune, source, console, seed, run.general_text)
        run.reused += [f"finetune {finetune.name}{label}"] if reused else []
        if after_stage:
            after_stage("finetune", f"{finetune.name}{label}")
    for sweep in planned_sweeps(settings):
        missed = [line for f in sweep.finetunes
                  for ok, line in [precondition(settings, FINETUNES[f], records.finetunes[f])] if not ok]
        if missed:
            records.skipped[sweep.name] = "; ".join(missed)
            console.print(f"[yellow]sweep {sweep.name} not run on training seed {seed}: precondition not met "
                          f"({records.skipped[sweep.name]})[/]")
            continue
        records.sweeps[sweep.name], reused = run_sweep(settings, sweep, run.data, records.finetunes, console)
        run.reused += [f"sweep {sweep.name}{label}"] if reused else []
        if after_stage:
            after_stage("sweep", f"{sweep.name}{label}")


def run_paper(settings: PaperSettings, console: Console | None = None,
              after_stage: Callable[[str, str], None] | None = None) -> PaperRun:
    """Run (or resume) every stage; write ``paper.md`` and ``paper.html`` in ``settings.out``.
    ``after_stage(kind, name)`` is called after each stage (tests stop a run there)."""

    console = console or Console()
    check_inputs(settings)
    settings.out.mkdir(parents=True, exist_ok=True)
    data, reused = run_data(settings, console)
    run = PaperRun(settings, data, reused=["data"] if reused else [])
    if after_stage:
        after_stage("data", settings.world)
    finetunes = needed_finetunes(settings)
    if any(f.shuffled for f in finetunes):
        run.shuffled_data, reused = run_data(settings, console, shuffled=True)
        run.reused += ["data shuffled"] if reused else []
        if after_stage:
            after_stage("data", run.shuffled_data.name)
    if any(f.gentle for f in finetunes):
        run.general_text = run_general_text(settings, console)
    for seed in settings.train_seeds:
        records = SeedRecords(run.finetunes, run.sweeps, run.skipped) if seed == settings.train_seed else \
            run.other_seeds.setdefault(seed, SeedRecords())
        run_seed(settings, run, seed, records, console, after_stage)
    if settings.trajectory is not None:
        run_trajectory(settings, run, console)
        if after_stage:
            after_stage("sweep", "trajectory")
    if settings.claims:
        run_claims(settings, run, console)
        if after_stage:
            after_stage("claims", "claims")
    for world in settings.worlds:
        console.rule(f"the appendix world {world}: its own run in {settings.out / 'worlds' / world}")
        run.worlds[world] = run_paper(appendix_settings(settings, world), console)
        if after_stage:
            after_stage("world", world)
    run.report = write_paper_report(run)
    console.print(f"report: {run.report} (and {run.report.with_suffix('.html')})")
    return run
