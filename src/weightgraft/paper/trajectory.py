"""``weightgraft paper --trajectory N`` (ours, not the paper's): the a2b finetune keeps its model
after step 1 and every N steps (``weightgraft.training.trajectory``); each snapshot is grafted into
PRE at the paper's position sets (FE, LT, FE+LT and its complement, headline and QA sentences),
and the report gives their top-5 and fact-specific log-probability against the step: when the
pathway the paper localizes forms during finetuning. With the claims on, claims 1-3 are judged on
every snapshot (``checkpoint(A2B, step=K)`` as ``models.sft``, against the control finetune, one
Holm family) and the report gives each claim's first held step
(:mod:`weightgraft.localization.claims.steps`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.console import Console

from weightgraft.configfile import json_digest
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.localization.claims.regions import RULES_VERSION
from weightgraft.localization.claims.steps import first_held_text, verdicts_text
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.run import run_localize
from weightgraft.models.spec import saved_steps
from weightgraft.paper.claims import claims_config
from weightgraft.paper.figures import HEADLINE, QA
from weightgraft.paper.page import Block, Image, Table
from weightgraft.paper.settings import PaperRun, PaperSettings
from weightgraft.paper.stages import (
    DataRecord,
    FinetuneRecord,
    Stage,
    TrajectoryClaimsOutputs,
    TrajectoryOutputs,
    stage_path,
)
from weightgraft.resume.manifests import Json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["TRAJECTORY_SCHEMES", "run_trajectory", "snapshot_steps", "trajectory_blocks", "trajectory_claims_stage",
           "trajectory_stage"]

TRAJECTORY_SCHEMES = ("PRE", "SFT", "FE", "LT", "FE+LT", "(FE+LT)^C")
HEADING = "When the pathway forms (ours, not the paper's: snapshots of the a2b finetune)"


def trajectory_stage(settings: PaperSettings, data: DataRecord,
                     a2b: FinetuneRecord) -> tuple[Stage[TrajectoryOutputs], dict[str, Any]]:
    """The trajectory sweep's stage (keyed by the a2b finetune's stage key) and its raw config."""
    common: dict[str, Any] = {"name": "paper-trajectory", "protocol": "authors",
                              "schemes": [{"preset": "position", "only": list(TRAJECTORY_SCHEMES)}],
                              "templates": [HEADLINE, QA], "directions": ["a2b"], "trajectory": {"role": "sft"},
                              "device": settings.device, "seed": settings.seed,
                              **({"batch_size": settings.batch_size} if settings.batch_size else {})}
    keyed = {**common, "data": f"data:{data.key}", "models": {"pre": settings.model, "sft": f"finetune:{a2b.key}"}}
    raw = {**common, "data": str(stage_path(data, settings.out, "dir")),
           "models": {"pre": settings.model, "sft": str(stage_path(a2b, settings.out, "model"))}}
    return Stage("sweep", "trajectory", {"config": keyed}, settings.out, TrajectoryOutputs), raw


def snapshot_steps(last: int, every: int) -> list[int]:
    """The steps a finetune of ``last`` steps keeps with ``--save-every every``: 1, every N, the last."""
    return sorted({1, last, *range(every, last + 1, every)})


def trajectory_claims_stage(settings: PaperSettings, data: DataRecord, finetunes: dict[str, FinetuneRecord],
                            steps: list[int]) -> tuple[Stage[TrajectoryClaimsOutputs], dict[str, Any]]:
    """The claims over the a2b finetune's snapshots at ``steps`` (keyed by the finetunes' stage
    keys) and its raw localize config: claims 1-3 on every snapshot, against the control."""
    a2b, control = finetunes["a2b"], finetunes.get("control")
    folder = stage_path(a2b, settings.out, "model")
    keyed: dict[str, str | list[str]] = {"pre": settings.model,
                                         "a2b": [f"checkpoint(finetune:{a2b.key}, step={s})" for s in steps],
             **({"control": f"finetune:{control.key}"} if control else {})}
    paths: dict[str, str | list[str]] = {"pre": settings.model, "a2b": [f"checkpoint({folder}, step={s})" for s in steps],
             **({"control": str(stage_path(control, settings.out, "model"))} if control else {})}
    raw = claims_config(settings, paths, str(stage_path(data, settings.out, "dir")))
    return Stage("claims", "trajectory", {"config": claims_config(settings, keyed, f"data:{data.key}")},
                 settings.out, TrajectoryClaimsOutputs), {**raw, "name": "paper-trajectory-claims"}


def run_trajectory_claims(settings: PaperSettings, run: PaperRun, console: Console) -> None:
    """Claims 1-3 on every snapshot of the a2b finetune, into ``run.trajectory_claims``."""
    import pandas as pd

    from weightgraft.paper.claims import judged_seeds

    if settings.train_seed not in judged_seeds(settings, run)[0]:
        run.skipped["claims trajectory"] = "the a2b finetune does not meet its precondition (no fact to localize)"
        return
    stage, raw = trajectory_claims_stage(settings, run.data, run.finetunes,
                                         saved_steps(stage_path(run.finetunes["a2b"], settings.out, "model")))
    done = stage.finished()
    if done is not None:
        run.trajectory_claims, run.reused = done, [*run.reused, "claims trajectory"]
        return
    started = time.time()
    console.rule("claims trajectory: claims 1-3 on each snapshot of the a2b finetune (one Holm family)")
    result = run_localize(parse_localize_config({**raw, "out": str(stage.folder / "run")}), progress=settings.progress)
    path = result.run_dir / "claims_steps.csv"
    if not path.is_file():  # no claim judged on the snapshots: said, not shown as an empty table
        run.skipped["claims trajectory"] = "no claims were judged on the snapshots (claims_steps.csv not written)"
        return
    table = pd.read_csv(path)
    rows = table.astype(object).where(table.notna(), None).to_dict("records")
    run.trajectory_claims = stage.finish(TrajectoryClaimsOutputs(run="run", steps=rows, rules=RULES_VERSION),
                                         time.time() - started)


def run_trajectory(settings: PaperSettings, run: PaperRun, console: Console) -> None:
    """The trajectory sweep of the first training seed's a2b finetune, into ``run.trajectory``."""
    a2b = run.finetunes.get("a2b")
    if a2b is None:
        run.skipped["trajectory"] = "no a2b finetune"
        return
    stage, raw = trajectory_stage(settings, run.data, a2b)
    done = stage.finished()
    if done is not None:
        run.trajectory, run.reused = done, [*run.reused, "sweep trajectory"]
        return
    started = time.time()
    console.rule("sweep trajectory: FE, LT, FE+LT and its complement from each snapshot of the a2b finetune")
    result = run_experiment(parse_config({**raw, "out": str(stage.folder / "run")}), progress=settings.progress)
    steps = result.summary["model_set"].map(parse_config(raw).set_steps())
    rows = result.summary.assign(step=steps)[["step", "template", "scheme", "n", "top5", "top5_lo", "top5_hi",
                                              "mean_fact_logprob", "fact_logprob_lo", "fact_logprob_hi"]]
    kept = rows.astype(object).where(rows.notna(), None).to_dict("records")
    run.trajectory = stage.finish(TrajectoryOutputs(run="run", rows=kept), time.time() - started)
    if settings.claims:
        run_trajectory_claims(settings, run, console)


def _pct(row: Json) -> str:
    return "n/a" if row["top5"] is None else f"{100 * row['top5']:.1f}"


def trajectory_blocks(run: PaperRun) -> list[Block]:
    """The report's section: each template's top-5 of every scheme by step, and a chart."""
    if run.trajectory is None:
        return []
    rows = run.trajectory.outputs.rows
    steps = sorted({r["step"] for r in rows})
    blocks: list[Block] = [("h2", HEADING), ("p", (
        f"The a2b finetune (training seed {run.settings.train_seed}) kept its model after step 1 and every "
        f"{run.settings.trajectory} steps; each snapshot grafted into PRE (authors' protocol, 40 a2b prompts a "
        "sentence). Top-5 accuracy in %, each with its 95% interval in the chart; SFT is the snapshot itself.")), ]
    for template in (HEADLINE, QA):
        here = {(r["step"], r["scheme"]): r for r in rows if r["template"] == template}
        blocks.append(("h3", f"{'Sentence 1 (headline)' if template == HEADLINE else 'Sentence 2 (QA)'}: top-5 by step"))
        blocks.append(Table(("step", *TRAJECTORY_SCHEMES),
                            [(str(step), *(_pct(here[(step, s)]) if (step, s) in here else "-" for s in TRAJECTORY_SCHEMES))
                             for step in steps]))
    digest = json_digest(rows)
    blocks.append(Image("paper-trajectory.png", "top-5 and fact-specific log-probability by training step", digest,
                        lambda: _chart(rows)))
    return blocks + _claims_blocks(run)


def _claims_blocks(run: PaperRun) -> list[Block]:
    """Each claim's first held step over the snapshots, and its verdict at every step."""
    if run.trajectory_claims is None:
        return []
    rows = run.trajectory_claims.outputs.steps
    return [("h3", "The claims along the steps"), ("p", (
        "Claims 1-3 judged on every snapshot against the control finetune, all rows one Holm family. A claim's first "
        "held step is the earliest snapshot from which it holds at every later one (it began to hold after the "
        "snapshot before it); a claim is said to hold where it does not in at most 5% of runs.")),
        Table(("template", "claim", "first held [share, interval (its level)]", "verdict by step"),
              [(r["template"], r["claim"], first_held_text(r), verdicts_text(r)) for r in rows])]


def _chart(rows: list[Json]) -> Figure:
    import pandas as pd

    from weightgraft.report.charts import trajectory_figure

    frame = pd.DataFrame(rows)
    frame = frame[frame["template"] == HEADLINE].assign(model_set=frame["step"].astype(str))
    return trajectory_figure(frame, "Sentence 1 (headline): grafts of each snapshot of the a2b finetune, by step")
