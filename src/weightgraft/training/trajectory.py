"""Snapshots along a finetune (``weightgraft train --save-every N``): the model at its first step
and every N steps, each a model folder, so that a sweep can graft each into PRE and say when a
pathway forms.

``OUT/trajectory/step-000010/`` holds the model as it was after optimizer step 10 (safetensors
and config, as :func:`weightgraft.models.load_model` reads a folder); ``OUT/trajectory.json``
lists every snapshot with its step, the training loss last logged at or before it, and the
top-5 accuracy of the answer's first token on the data's test prompts of the trained direction
(the finetune's precondition measure), computed from the snapshot's weights as saved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from weightgraft import atomic
from weightgraft.data.freeform import load_prompts
from weightgraft.data.prompts import answer_token_ids
from weightgraft.engine.metric_table import score_next_token
from weightgraft.models.spec.checkpoint import SNAPSHOTS, snapshot_dir
from weightgraft.training.errors import TrainingError

__all__ = ["SNAPSHOTS", "TRAJECTORY_NAME", "Snapshot", "SnapshotCallback", "read_trajectory", "snapshot_dir"]

TRAJECTORY_NAME = "trajectory.json"
FORMAT = "weightgraft.trajectory/1"


@dataclass(frozen=True)
class Snapshot:
    """One saved step: its folder (relative to the finetune's folder) and what it measured."""

    step: int
    folder: str
    train_loss: float | None
    top5: float | None
    n_prompts: int


def read_trajectory(out: str | Path) -> list[Snapshot]:
    """The snapshots a finetune kept, by step; a folder without them is a one-line error."""
    path = Path(out).expanduser() / TRAJECTORY_NAME
    if not path.is_file():
        raise TrainingError(f"{Path(out)} holds no trajectory ({TRAJECTORY_NAME}): finetune it with "
                            "`weightgraft train ... --save-every N`")
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    return [Snapshot(**s) for s in sorted(data["snapshots"], key=lambda s: s["step"])]


def _trained_prompts(data_dir: Path, split: str) -> list[Any]:
    """The test prompts of what the split trains: its direction (a2b, b2a), both directions
    (both), or its group (task, relation)."""
    path = data_dir / "test_prompts.jsonl"
    if not path.is_file():
        return []
    prompts = load_prompts(data_dir)
    if split in ("a2b", "b2a"):
        return [p for p in prompts if p.direction == split]
    if split in ("task", "relation"):
        return [p for p in prompts if p.group == split]
    return prompts


@torch.no_grad()
def _top5(model: torch.nn.Module, tokenizer: Any, prompts: list[Any]) -> float | None:
    """Share of ``prompts`` whose answer's first token is among the model's 5 likeliest next tokens."""
    hits = []
    device = next(model.parameters()).device
    for p in prompts:
        answer = answer_token_ids(tokenizer, p.answer)
        if not answer:
            continue
        ids = torch.tensor([tokenizer(p.prompt, add_special_tokens=True)["input_ids"]], device=device)
        hits.append(score_next_token(model(input_ids=ids).logits[0, -1].float().cpu(), answer[0]).hits[5])
    return sum(hits) / len(hits) if hits else None


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class SnapshotCallback(_callback_base()):  # type: ignore[misc]
    """Saves the model after step 1 and every ``every`` steps (and the last), with its top-5 on
    the trained direction's test prompts, into ``out`` (main process only)."""

    def __init__(self, out: Path, every: int, tokenizer: Any, data_dir: Path, split: str) -> None:
        if every < 1:
            raise TrainingError(f"--save-every {every}: save at least every step (N >= 1)")
        self.out, self.every, self.tokenizer = Path(out), every, tokenizer
        self.prompts = _trained_prompts(Path(data_dir), split)
        self.snapshots: dict[int, Snapshot] = {}
        if (self.out / TRAJECTORY_NAME).is_file():  # a resumed finetune keeps the snapshots it made
            self.snapshots = {s.step: s for s in read_trajectory(self.out)}

    def _loss(self, state: Any) -> float | None:
        losses = [h["loss"] for h in state.log_history if "loss" in h and h.get("step", 0) <= state.global_step]
        return float(losses[-1]) if losses else None

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        step = int(state.global_step)
        due = step == 1 or step % self.every == 0 or step >= state.max_steps
        if not due or step in self.snapshots or not state.is_world_process_zero or model is None:
            return
        folder = snapshot_dir(self.out, step)
        target = getattr(model, "module", model)
        target.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)
        was_training = target.training
        target.eval()
        top5 = _top5(target, self.tokenizer, self.prompts)
        target.train(was_training)
        self.snapshots[step] = Snapshot(step, folder.relative_to(self.out).as_posix(), self._loss(state), top5,
                                        len(self.prompts))
        atomic.write_json(self.out / TRAJECTORY_NAME, {"format": FORMAT, "every": self.every,
                                                      "snapshots": [asdict(s) for s in sorted(
                                                          self.snapshots.values(), key=lambda s: s.step)]})
