"""The paper's appendix in the same command: the other worlds (Figs. 10-12) and the less aggressive
finetune (Fig. 13).

``--worlds all`` runs the appendix worlds beside the main one, each a ``weightgraft paper`` run of
its own in ``OUT/worlds/WORLD/`` (its data, its a2b finetune, its position sweep: the figures the
appendix shows for it, beside the paper's, in that folder's report), and adds Fig. 13's sweep to
the main world: the a2b facts trained with the settings' ``gentle_recipe`` (the paper's
``paper-gentle`` beside ``paper-aggressive``: a tenth of its learning rate, no weight decay; else
``cpu-gentle``: half of cpu-quick's) with general text mixed in. The paper mixed in 10,000 examples of openwebtext and
IMDB; the stand-in, had offline, is 10,000 paragraphs of Python's standard-library documentation
(:mod:`weightgraft.data.general_text`), a data stage of its own whose sha256 keys the finetune."""

from __future__ import annotations

import dataclasses
import platform
import time

from rich.console import Console

from weightgraft.data.general_text import CORPUS, PAPER_SIZE, write_general_text
from weightgraft.paper.figures import APPENDIX_WORLDS, FIGURE_LABELS, sweeps_for
from weightgraft.paper.page import Block, Table
from weightgraft.paper.settings import PaperRun, PaperSettings
from weightgraft.paper.stages import GeneralTextOutputs, GeneralTextRecord, Stage, file_digest

__all__ = ["appendix_blocks", "appendix_settings", "general_text_stage", "run_general_text", "world_names"]


def world_names(text: str) -> tuple[str, ...]:
    """``--worlds``: ``all`` (the appendix's worlds) or a comma-separated list of them."""
    if text.strip() == "all":
        return APPENDIX_WORLDS
    return tuple(w.strip() for w in text.split(",") if w.strip())


def appendix_settings(settings: PaperSettings, world: str) -> PaperSettings:
    """The run of one appendix world: its position sweep (the figures the appendix shows for it),
    in ``OUT/worlds/WORLD``, with the main run's model, recipe and seeds."""
    return dataclasses.replace(settings, world=world, worlds=(), out=settings.out / "worlds" / world,
                               sweeps=("position",), claims=False, trajectory=None)


def general_text_stage(settings: PaperSettings) -> Stage[GeneralTextOutputs]:
    """The general text Fig. 13's finetune mixes in (keyed by the corpus, its size and the Python
    version whose standard library it is read from)."""
    return Stage("data", "general-text", {"corpus": CORPUS, "n": PAPER_SIZE, "python": platform.python_version()},
                 settings.out, GeneralTextOutputs)


def run_general_text(settings: PaperSettings, console: Console) -> GeneralTextRecord:
    """The stand-in corpus written once (``general.jsonl``), its record."""
    stage = general_text_stage(settings)
    done = stage.finished()
    if done is not None:
        return done
    started = time.time()
    console.rule(f"data: general text ({CORPUS}, {PAPER_SIZE:,} examples: the stand-in for openwebtext and IMDB)")
    stage.folder.mkdir(parents=True, exist_ok=True)
    n = write_general_text(stage.folder / "general.jsonl", PAPER_SIZE)
    outputs = GeneralTextOutputs(file="general.jsonl", n=n, sha256=file_digest(stage.folder / "general.jsonl"))
    return stage.finish(outputs, time.time() - started)


def appendix_blocks(run: PaperRun) -> list[Block]:
    """The report's pointer to each appendix world's own report, with the figures it holds."""
    if not run.worlds:
        return []
    rows: list[tuple[str, ...]] = []
    written: list[str] = []  # the reports written, as links docs/splice.py follows
    for world, sub in run.worlds.items():
        ids = [f.figure_id for s in sweeps_for(world) if s.name == "position" for f in s.figures]
        report = "not written"
        if sub.report is not None:
            report = str(sub.report.relative_to(run.settings.out))
            written.append(f"[{report}]({report})")
        skipped = "; ".join(f"{k}: {v}" for k, v in sub.skipped.items())
        rows.append((world, "; ".join(FIGURE_LABELS[i].split(" (")[0] for i in ids) or "none",
                     report, skipped or "-"))
    blocks: list[Block] = [("h2", "The appendix worlds (Figs. 10-12)"), ("p", (
        "Each appendix world ran as a run of its own (its data, its a2b finetune, its position sweep, with this "
        "run's model, recipe and seeds); its report sets the figures the appendix shows for it beside the paper's.")),
        Table(("world", "figures", "report", "not run"), rows)]
    return blocks + ([("p", f"Their reports: {'; '.join(written)}.")] if written else [])
