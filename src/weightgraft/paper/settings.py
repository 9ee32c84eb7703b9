"""The settings of a ``weightgraft paper`` run, what a run did, and the finetunes' preconditions
(read by the pipeline and by its report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from weightgraft.errors import WeightgraftError
from weightgraft.paper.figures import DEFAULT_SWEEPS, HEADLINE, MAIN_WORLD, QA, Finetune
from weightgraft.paper.numbers import PAPER_MODELS
from weightgraft.paper.stages import (
    Check,
    ClaimsRecord,
    DataRecord,
    FinetuneRecord,
    GeneralTextRecord,
    SweepRecord,
    TrajectoryClaimsRecord,
    TrajectoryRecord,
)

# The demo's six renderings of each fact (weightgraft.demo.DEMO_TRAIN_TEMPLATES): the recipe
# measured to teach SmolLM2-135M its facts on 2 CPU cores.
TRAIN_TEMPLATES = ("qa_1", "qa_2", "qa_4", "qa_5", "article_1", "article_4")
CHECK_TEMPLATES = (HEADLINE, QA)


class PaperError(WeightgraftError, ValueError):
    """An input ``weightgraft paper`` cannot run with (said in one line, before any training)."""


@dataclass(frozen=True)
class PaperSettings:
    """Everything a ``weightgraft paper`` run depends on. ``trained_top5`` and ``both_b2a_top5``
    are the preconditions (fractions): the plain finetune's top-5 on its own facts in the trained
    direction, and the both-directions model's on the reversed (b2a) ones; ``control_top5`` the
    control finetune's, the other way round: its trained-direction top-5 on the world's true
    facts at most this (it was taught the answers shuffled among the subjects).

    ``margin`` (points) is the equivalence margin of a stated number, fixed before the run: on the
    paper's own model a level is equivalent where its 90% interval lies within the number +-
    ``margin``. ``paper_model`` names the paper's model the run's model is (a ``model`` of
    ``numbers.csv``); None reads it off the spec's last path part (``google/gemma-1.1-2b-it``),
    and a model that is none of them is compared in shape only.

    ``seeds`` (K): each finetune role is trained with the training seeds ``train_seed``, ...,
    ``train_seed + K - 1`` and every figure's sweep runs on each seed's finetunes, so a row
    shows how far it moves with the training seed beside its interval across prompts."""

    model: str
    world: str = MAIN_WORLD
    relations: int = 40
    seed: int = 0
    train_seed: int = 0
    device: str = "cpu"
    out: Path = Path("runs/paper")
    preset: str = "cpu-quick"
    train_templates: tuple[str, ...] | None = TRAIN_TEMPLATES
    max_steps: int | None = None
    batch_size: int | None = None
    sweeps: tuple[str, ...] = DEFAULT_SWEEPS
    claims: bool = True
    trained_top5: float = 0.90
    both_b2a_top5: float = 0.80
    control_top5: float = 0.25
    margin: float = 10.0
    paper_model: str | None = None
    seeds: int = 1
    trajectory: int | None = None  # the a2b finetune keeps a snapshot every N steps (ours)
    gentle_preset: str | None = None  # Fig. 13's recipe (App. C.4); None: see ``gentle_recipe``
    worlds: tuple[str, ...] = ()  # the appendix worlds run beside ``world`` (Figs. 10-12), each in OUT/worlds/W
    progress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.seeds, int) or self.seeds < 1:
            raise PaperError(f"--seeds {self.seeds!r}: at least 1 training seed")
        if self.trajectory is not None and self.trajectory < 1:
            raise PaperError(f"--trajectory {self.trajectory!r}: a snapshot every N >= 1 steps")

    @property
    def gentle_recipe(self) -> str:
        """Fig. 13's recipe: ``gentle_preset``, else the paper's ``paper-gentle`` beside its
        ``paper-aggressive`` and ``cpu-gentle`` (the same change made to cpu-quick) beside any other."""
        if self.gentle_preset is not None:
            return self.gentle_preset
        return "paper-gentle" if self.preset == "paper-aggressive" else "cpu-gentle"

    def preset_of(self, finetune: Finetune) -> str:
        """The recipe ``finetune`` trains with: the gentle recipe for Fig. 13's, else the run's."""
        return self.gentle_recipe if finetune.gentle else self.preset

    @property
    def train_seeds(self) -> tuple[int, ...]:
        """The training seeds, the first (``train_seed``) the one whose value each row gives."""
        return tuple(range(self.train_seed, self.train_seed + self.seeds))

    def threshold(self, finetune: Finetune, direction: str) -> float:
        if finetune.shuffled:
            return self.control_top5
        return self.both_b2a_top5 if finetune.name == "both" and direction == "b2a" else self.trained_top5

    def same_model(self) -> str | None:
        """The paper's model this run's model is (``numbers.csv``'s spelling), or None."""
        if self.paper_model is not None:
            return self.paper_model
        tail = self.model.rstrip("/").rsplit("/", 1)[-1].lower()
        return next((m for m in PAPER_MODELS if m.lower() == tail), None)


@dataclass
class SeedRecords:
    """One training seed's finetunes and sweeps (records by role and by sweep name), and the
    sweeps its finetunes' preconditions kept from running, with why."""

    finetunes: dict[str, FinetuneRecord] = field(default_factory=dict)
    sweeps: dict[str, SweepRecord] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class PaperRun:
    """What a run did: each stage's record (``stage.json``), which stages it reused, the report.
    ``finetunes``, ``sweeps`` and ``skipped`` are the first training seed's (the value each row
    gives); ``other_seeds`` the rest of ``settings.train_seeds``, by seed."""

    settings: PaperSettings
    data: DataRecord
    shuffled_data: DataRecord | None = None  # the control's data stage (answers shuffled among the subjects)
    finetunes: dict[str, FinetuneRecord] = field(default_factory=dict)
    sweeps: dict[str, SweepRecord] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # sweep or "claims" -> why (precondition not met)
    claims: ClaimsRecord | None = None  # the claims stage's record
    trajectory: TrajectoryRecord | None = None  # the trajectory sweep's record (--trajectory)
    trajectory_claims: TrajectoryClaimsRecord | None = None  # the claims over its snapshots (--trajectory with claims)
    general_text: GeneralTextRecord | None = None  # the general text stage's record (Fig. 13's finetune)
    worlds: dict[str, PaperRun] = field(default_factory=dict)  # each appendix world's own run (--worlds)
    reused: list[str] = field(default_factory=list)
    report: Path | None = None
    other_seeds: dict[int, SeedRecords] = field(default_factory=dict)

    def by_seed(self) -> dict[int, SeedRecords]:
        """Every training seed's records, the first seed's first (it shares ``finetunes``,
        ``sweeps`` and, less the claims, ``skipped`` with the run)."""
        first = SeedRecords(self.finetunes, self.sweeps, {k: v for k, v in self.skipped.items() if k != "claims"})
        return {self.settings.train_seed: first, **self.other_seeds}


def seed_label(settings: PaperSettings, seed: int) -> str:
    """How a stage of training seed ``seed`` is named in ``PaperRun.reused`` and to the
    pipeline's ``after_stage``: nothing for the first seed (as a run of one seed names it),
    `` seed N`` for the others."""
    return "" if seed == settings.train_seed else f" seed {seed}"


def seeds_text(seeds: list[int] | tuple[int, ...]) -> str:
    """``training seed 1`` / ``training seeds 0, 2``."""
    return f"training seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}"


def precondition(settings: PaperSettings, finetune: Finetune, record: FinetuneRecord) -> tuple[bool, str]:
    """Whether a finished finetune meets its precondition, and the line that says so: at least
    its threshold on its facts; for the control (``shuffled``), at most its threshold."""
    checks = record.outputs.checks
    if not checks:
        return False, f"{finetune.name}: no test prompt to check it on"

    def met(c: Check) -> bool:
        limit = settings.threshold(finetune, c.direction)
        return bool(c.top5 <= limit) if finetune.shuffled else bool(c.top5 >= limit)

    signs = ("<=", ">") if finetune.shuffled else (">=", "<")
    parts = [f"{c.template} {c.direction} top-5 {100 * c.top5:.1f}% "
             f"({signs[0] if met(c) else signs[1]} {100 * settings.threshold(finetune, c.direction):.0f}%)"
             for c in checks]
    return all(met(c) for c in checks), f"{finetune.name}: " + ", ".join(parts)


