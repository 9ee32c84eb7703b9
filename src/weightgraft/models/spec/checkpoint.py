"""``checkpoint(DIR, step=K)``: the model a finetune kept after optimizer step K.

``weightgraft train --save-every N`` writes ``DIR/trajectory/step-NNNNNN/`` (a model folder)
for its first step, every N steps and its last (:mod:`weightgraft.training.trajectory`); this
spec names one of them wherever a model is accepted, so a run, ``generate`` or ``wg.load`` can
take a step of a training run by its number instead of its folder."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from weightgraft.models.errors import ModelNotFoundError, ModelSpecError
from weightgraft.models.spec.base import fill_text
from weightgraft.models.spec.named import FolderSpec

if TYPE_CHECKING:
    from weightgraft.models.loaded import LoadedModel, LoadSettings

SNAPSHOTS = "trajectory"  # the folder under a finetune's output that holds its snapshots
_CHECKPOINT = re.compile(r"^\s*checkpoint\s*\((?P<args>.*)\)\s*$", re.S)
_HINT = "write checkpoint(DIR, step=K), e.g. checkpoint(runs/sft, step=40)"


def snapshot_dir(out: str | Path, step: int) -> Path:
    """The folder of the snapshot after optimizer step ``step`` of the finetune in ``out``."""
    return Path(out) / SNAPSHOTS / f"step-{step:06d}"


def saved_steps(out: str | Path) -> list[int]:
    """The steps whose snapshot folders ``out`` holds."""
    found = (Path(out).expanduser() / SNAPSHOTS).glob("step-*")
    return sorted(int(p.name[5:]) for p in found if p.is_dir() and p.name[5:].isdigit())


@dataclass(frozen=True)
class CheckpointSpec(FolderSpec):
    """``checkpoint(DIR, step=K)``: the snapshot of the finetune in DIR after step K, a model folder."""

    path: str = ""
    run: str = ""
    step: int = 0
    text: str = field(default="", compare=False)
    kind: ClassVar[str] = "checkpoint"

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(snapshot_dir(self.run, self.step)))
        fill_text(self, f"checkpoint({self.run}, step={self.step})")

    @property
    def training_step(self) -> int | None:
        return self.step

    @property
    def training_run(self) -> Path | None:
        return Path(self.run).expanduser().resolve()

    def check(self, role: str = "model") -> None:
        if not Path(self.path).expanduser().is_dir():
            steps = saved_steps(self.run)
            raise ModelNotFoundError(
                f"{role} {self.text!r}: no snapshot after step {self.step} in {Path(self.run) / SNAPSHOTS} ("
                + (f"saved: {', '.join(map(str, steps))}" if steps else
                   "it holds none: finetune with `weightgraft train ... --save-every N`") + ")")
        super().check(role)

    def load(self, settings: LoadSettings, quantization: object = None) -> LoadedModel:
        self.check()
        return super().load(settings, quantization)

    def anchored(self, folder: Path) -> str | None:
        if Path(self.run).expanduser().is_absolute() or not (Path(folder) / self.run).exists():
            return self.text
        return f"checkpoint({Path(folder) / self.run}, step={self.step})"


def read_checkpoint(text: str) -> CheckpointSpec | None:
    """The checkpoint spec ``text`` writes, None where it is no ``checkpoint(...)``; a malformed
    one is one :class:`ModelSpecError` line."""
    m = _CHECKPOINT.match(text)
    if m is None:
        if re.match(r"\s*checkpoint\s*\(", text):
            raise ModelSpecError(f"model spec {text!r}: {_HINT}")
        return None
    run, comma, rest = (x.strip() for x in m.group("args").rpartition(","))
    key, _, value = (x.strip() for x in rest.partition("="))
    run = run.strip("'\"").strip()
    if not comma or not run or key != "step" or not value.isdigit():
        raise ModelSpecError(f"model spec {text!r}: {_HINT}")
    return CheckpointSpec(run=run, step=int(value), text=text)
