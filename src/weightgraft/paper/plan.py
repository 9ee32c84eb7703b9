"""``weightgraft paper --plan``: every stage with its planned time and memory, before anything
runs. Sweeps are planned by ``weightgraft plan``'s arithmetic (``plan_experiment``: every
finetune has the base model's shapes, so the base spec stands in for it); a finetune by the same
rates (this device's measured rate, or none where a CUDA card cannot be measured): forward and
backward ~3x a forward's FLOPs per step, and fp32 weights, gradients and AdamW's two moments
(4 x the weights) plus activations, which are not counted. The world is built in a temporary
folder for the counts (seconds; nothing is written under ``--out``). With ``--seeds K`` every
finetune and sweep is planned K times, once per training seed."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from weightgraft.data import build_dataset
from weightgraft.data.general_text import CORPUS, PAPER_SIZE, stdlib_paragraphs
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.plan import plan_experiment
from weightgraft.localization.claims.evidence import claims_notes
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.plan_input import plan_input
from weightgraft.models.spec import parse_spec
from weightgraft.paper.appendix import appendix_settings, general_text_stage
from weightgraft.paper.claims import CLAIM_FINETUNES, claims_config, claims_stage
from weightgraft.paper.figures import FINETUNES, Finetune, check_config, sweep_config
from weightgraft.paper.pipeline import (
    check_inputs,
    data_stage,
    finetune_stage,
    needed_finetunes,
    planned_sweeps,
    sweep_stage,
)
from weightgraft.paper.settings import CHECK_TEMPLATES, PaperSettings
from weightgraft.paper.stages import (
    DataOutputs,
    DataRecord,
    FinetuneOutputs,
    FinetuneRecord,
    GeneralTextOutputs,
    Stage,
)
from weightgraft.planning.calibration import module_calls
from weightgraft.planning.cards import Card
from weightgraft.planning.costs import forward_flops, param_bytes
from weightgraft.planning.lengths import tokenizer_for
from weightgraft.planning.localize import plan_localize_work
from weightgraft.planning.timing import rate_for
from weightgraft.resume.folder import Record
from weightgraft.resume.manifests import StageRecord
from weightgraft.resume.stages import record_type
from weightgraft.training import get_preset
from weightgraft.training.texts import split_records

TRAIN_FLOPS_PER_FORWARD = 3.0  # a training step: forward + backward
ADAM_COPIES = 4  # fp32 weights, gradients, AdamW's first and second moments

Out = TypeVar("Out", bound=Record)


@dataclass(frozen=True)
class PlannedStage:
    stage: str
    what: str
    seconds: float | None
    memory_bytes: int | None
    done: bool
    counts: str = ""  # what the stage holds (texts and steps, rows, prompts)
    notes: tuple[str, ...] = ()  # each one sentence of the planners'


def _record(stage: Stage[Out], outputs: Out) -> StageRecord[Out]:
    """The record ``stage`` will have once finished (what later stages are keyed by and read)."""
    return record_type(stage.outputs)(kind=stage.kind, name=stage.name, key=stage.key, outputs=outputs)


def _texts(settings: PaperSettings, finetune: Finetune, data_dir: Path) -> list[str]:
    """The texts ``finetune`` trains on: its split's, and for a gentle finetune the general text."""
    texts = [r["text"] for r in split_records(data_dir, finetune.split, settings.train_templates)[0]]
    if not finetune.gentle:
        return texts
    preset = get_preset(settings.preset_of(finetune))
    return texts + stdlib_paragraphs(preset.supplemental_count(len(texts), PAPER_SIZE))


def _steps(settings: PaperSettings, finetune: Finetune, data_dir: Path, n_texts: int | None = None) -> int:
    """The optimizer steps of ``finetune`` (the trainer's count: batches per epoch x epochs) over
    ``n_texts`` texts (None: its texts, counted here)."""
    preset = get_preset(settings.preset_of(finetune))
    n = len(_texts(settings, finetune, data_dir)) if n_texts is None else n_texts
    return settings.max_steps or math.ceil(math.ceil(n / preset.batch_size) * preset.epochs)


def _train_plan(settings: PaperSettings, finetune: Finetune, data_dir: Path,
                gpu: Card | None = None) -> tuple[float | None, int, str, tuple[str, ...]]:

    preset = get_preset(settings.preset_of(finetune))
    fp = parse_spec(settings.model).footprint()
    texts = _texts(settings, finetune, data_dir)
    tok, how = tokenizer_for(fp)
    lengths = sorted(min(len(tok(t)["input_ids"]), preset.max_length) for t in texts)
    steps = _steps(settings, finetune, data_dir, len(texts))
    per_epoch = max(1, math.ceil(len(texts) / preset.batch_size))
    memory = ADAM_COPIES * param_bytes(fp, "float32")
    rate, rate_note = rate_for("cuda" if gpu is not None else settings.device, "float32", gpu)
    counts = f"{len(texts)} texts, {steps} steps of {preset.batch_size}"
    notes = (f"lengths by {how}", "a finetune's time is 3 forwards a step at the measured forward rate (SmolLM2-135M "
             "a2b, 1 CPU thread: planned 10.7 min, took 10.2 min)", *([rate_note] if rate_note else []))
    if rate is None:
        return None, memory, counts, notes
    seconds = 0.0
    for i in range(per_epoch):  # length-grouped batches of one epoch, then scaled to the steps
        chunk = lengths[i * preset.batch_size:(i + 1) * preset.batch_size] or lengths[-1:]
        seq = max(chunk)
        flops = forward_flops(fp, len(chunk) * seq, seq, len(chunk) * seq)
        seconds += rate.batch_seconds(TRAIN_FLOPS_PER_FORWARD * flops, 3 * module_calls(fp))
    return seconds * steps / per_epoch, memory, counts, notes


def _claims_plan(settings: PaperSettings, data: DataRecord, seeds: dict[int, dict[str, FinetuneRecord]],
                 data_dir: Path, gpu: Card | None) -> PlannedStage:
    """The claims stage by ``weightgraft plan``'s localize arithmetic, the base spec standing in
    for every finetune (same shapes); with several training seeds, one SFT model per seed's a2b
    finetune (planned as if every seed's meets its precondition)."""

    finetunes = seeds[settings.train_seed]
    several = settings.seeds > 1 and "a2b" in finetunes
    stage, _ = claims_stage(settings, data, finetunes, [f["a2b"] for f in seeds.values()] if several else None)
    names = [n for n in CLAIM_FINETUNES if n in finetunes and n != "control"]
    raw = claims_config(settings, {"pre": settings.model, **dict.fromkeys(names, settings.model)}, str(data_dir))
    config = parse_localize_config({**raw, "device": "cuda" if gpu is not None else settings.device,
                                    "out": str(data_dir.parent / "claims")})
    if "control" in finetunes:  # the base spec stands in for the control too (a config refuses it as the sft's twin)
        config = config.model_copy(update={"models": {**config.models, "control": settings.model}})
    work = plan_input(config)
    if several:  # a config refuses one spec twice in models.sft: each seed's model is the first's, relabelled
        first, *rest = work.sfts
        work = replace(work, sfts=[replace(first, label=f"sft[{i}]") for i in range(settings.seeds)] + rest)
    plan = plan_localize_work(work, gpu=gpu)
    return PlannedStage("claims", "the paper's claims (exact region grafts against their nulls)"
                        + (f" on the a2b finetunes of {settings.seeds} training seeds" if several else ""),
                        plan.predicted_seconds, plan.peak_bytes, stage.finished() is not None,
                        f"{len(work.claim_prompts)} prompts", (*plan.notes, *claims_notes(config)))


def _trajectory_plan(settings: PaperSettings, data_rec: DataRecord, a2b: FinetuneRecord,
                     data_dir: Path, gpu: Card | None, tmp: str) -> PlannedStage:
    """The trajectory sweep: one position sweep per snapshot (step 1, every N steps, the last)."""
    from weightgraft.paper.trajectory import snapshot_steps, trajectory_stage

    stage, raw = trajectory_stage(settings, data_rec, a2b)
    steps, every = _steps(settings, FINETUNES["a2b"], data_dir), settings.trajectory or 1
    n = len(snapshot_steps(steps, every))
    one = plan_experiment(parse_config({**raw, "trajectory": None, "models": {"pre": settings.model, "sft": settings.model},
                                        "data": str(data_dir), "out": tmp}), gpu=gpu)
    seconds = None if one.predicted_seconds is None else n * one.predicted_seconds
    return PlannedStage("sweep", f"trajectory (ours: FE, LT, FE+LT from {n} snapshots of the a2b finetune)", seconds,
                        one.peak_bytes, stage.finished() is not None, f"{n * one.rows} rows", tuple(one.notes))


def _trajectory_claims_plan(settings: PaperSettings, data_rec: DataRecord, finetunes: dict[str, FinetuneRecord],
                            data_dir: Path, gpu: Card | None) -> PlannedStage:
    """Claims 1-3 on every snapshot of the a2b finetune: the claims' localize arithmetic with one
    SFT model per snapshot (the base spec standing in for each)."""
    from weightgraft.paper.trajectory import snapshot_steps, trajectory_claims_stage

    steps = snapshot_steps(_steps(settings, FINETUNES["a2b"], data_dir), settings.trajectory or 1)
    stage, _ = trajectory_claims_stage(settings, data_rec, finetunes, steps)
    raw = claims_config(settings, {"pre": settings.model, "a2b": settings.model}, str(data_dir))
    config = parse_localize_config({**raw, "device": "cuda" if gpu is not None else settings.device,
                                    "out": str(data_dir.parent / "claims-trajectory")})
    if "control" in finetunes:
        config = config.model_copy(update={"models": {**config.models, "control": settings.model}})
    work = plan_input(config)
    first, *rest = work.sfts
    work = replace(work, sfts=[replace(first, label=f"sft[{i}]") for i in range(len(steps))] + rest)
    plan = plan_localize_work(work, gpu=gpu)
    return PlannedStage("claims", f"trajectory (ours: claims 1-3 on {len(steps)} snapshots of the a2b finetune)",
                        plan.predicted_seconds, plan.peak_bytes, stage.finished() is not None,
                        f"{len(work.claim_prompts)} prompts", tuple(plan.notes))


def plan_paper(settings: PaperSettings, gpu: Card | None = None) -> list[PlannedStage]:
    """Every stage ``run_paper(settings)`` would run, with planned seconds and memory; a stage
    already finished in ``settings.out`` is marked done (it will be reused). ``gpu``: plan as on
    one card of that kind (its memory and stated rates), whether or not it is here; the model
    may then be a ``random:`` config (shapes only: nothing trains)."""

    check_inputs(settings, planning_for=gpu)
    stages: list[PlannedStage] = []
    needed = needed_finetunes(settings)
    data = data_stage(settings)
    records = {False: _record(data, DataOutputs(dir="data"))}
    stages.append(PlannedStage("data", f"{settings.world}, {settings.relations} relations, seed {settings.seed}",
                               1.0, None, data.finished() is not None, "a few seconds"))
    if any(f.shuffled for f in needed):
        shuffled = data_stage(settings, shuffled=True)
        records[True] = _record(shuffled, DataOutputs(dir="data"))
        stages.append(PlannedStage("data", f"{settings.world}, {settings.relations} relations, seed {settings.seed}, "
                                   "answers shuffled among the subjects (the control's)", 1.0, None,
                                   shuffled.finished() is not None, "a few seconds"))
    data_rec = records[False]
    general = None
    if any(f.gentle for f in needed):
        text_stage = general_text_stage(settings)
        general = _record(text_stage, GeneralTextOutputs(file="general.jsonl"))
        stages.append(PlannedStage("data", f"general text ({CORPUS}, {PAPER_SIZE:,} examples: the stand-in for "
                                   "openwebtext and IMDB)", 5.0, None, text_stage.finished() is not None, "seconds"))
    with tempfile.TemporaryDirectory(prefix="weightgraft-paper-plan-") as tmp:
        data_dir = Path(tmp) / "data"
        build_dataset(settings.world, n=settings.relations, seed=settings.seed, out=data_dir)
        common: dict[str, Any] = {"device": "cuda" if gpu is not None else settings.device, "seed": settings.seed, "batch_size": settings.batch_size}
        seeds: dict[int, dict[str, FinetuneRecord]] = {}
        # a finetune of the same split, directions and groups is planned once: the control is the a2b
        # recipe on as many texts (the same texts with the answers moved), so its time is the a2b's,
        # and another training seed trains on the same texts for as many steps
        planned: dict[tuple[Any, ...], tuple[float | None, int, str, tuple[str, ...]]] = {}
        for seed in settings.train_seeds:
            finetunes = seeds.setdefault(seed, {})
            for finetune in needed:
                stage = finetune_stage(settings, finetune, records[finetune.shuffled], seed, general)
                finetunes[finetune.name] = _record(stage, FinetuneOutputs(model="model"))
                same = (finetune.split, finetune.directions, finetune.groups, finetune.gentle)
                if same not in planned:
                    seconds, memory, counts, notes = _train_plan(settings, finetune, data_dir, gpu)
                    check = plan_experiment(parse_config({**check_config(finetune, settings.model, str(data_dir),
                                                                         CHECK_TEMPLATES, **common), "out": tmp}),
                                            gpu=gpu)
                    if seconds is not None and check.predicted_seconds is not None:
                        seconds += check.predicted_seconds
                    planned[same] = (seconds, max(memory, check.peak_bytes), counts, notes)
                seconds, memory, counts, notes = planned[same]
                shuffled_note = ", answers shuffled among the subjects" if finetune.shuffled else ""
                seed_note = f", training seed {seed}" if settings.seeds > 1 else ""
                stages.append(PlannedStage("finetune", f"{finetune.name} (split {finetune.split}{shuffled_note}, "
                                           f"preset {settings.preset_of(finetune)}{seed_note}) and its precondition check", seconds,
                                           memory, stage.finished() is not None, counts, notes))
        swept: dict[str, Any] = {}  # each sweep is planned once: every seed's finetunes have the same shapes
        for seed in settings.train_seeds:
            for sweep in planned_sweeps(settings):
                swept_stage, _ = sweep_stage(settings, sweep, data_rec, seeds[seed])
                if sweep.name not in swept:
                    raw = sweep_config(sweep, {role: settings.model for role in sweep.roles}, str(data_dir), **common)
                    swept[sweep.name] = plan_experiment(parse_config({**raw, "out": tmp}), gpu=gpu)
                plan = swept[sweep.name]
                notes = (*plan.notes, *([] if plan.fits else [plan.refusal()]))
                seed_note = f", training seed {seed}" if settings.seeds > 1 else ""
                stages.append(PlannedStage("sweep", f"{sweep.name} ({sweep.label.partition(':')[0]}{seed_note})",
                                           plan.predicted_seconds, plan.peak_bytes, swept_stage.finished() is not None,
                                           f"{plan.rows} rows", notes))
        if settings.trajectory is not None and "a2b" in seeds[settings.train_seed]:
            stages.append(_trajectory_plan(settings, data_rec, seeds[settings.train_seed]["a2b"], data_dir, gpu, tmp))
        if settings.claims:
            stages.append(_claims_plan(settings, data_rec, seeds, data_dir, gpu))
            if settings.trajectory is not None and "a2b" in seeds[settings.train_seed]:
                stages.append(_trajectory_claims_plan(settings, data_rec, seeds[settings.train_seed], data_dir, gpu))
    for world in settings.worlds:  # each appendix world's own run, its stages named by it
        stages += [dataclasses.replace(s, what=f"{world}: {s.what}") for s in plan_paper(appendix_settings(settings, world), gpu)]
    stages.append(PlannedStage("report", "paper.md and paper.html", 1.0, None, False))
    return stages

