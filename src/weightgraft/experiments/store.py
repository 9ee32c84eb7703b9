"""The results store: one row per (model set, template, scheme, example), safe to kill.

Each finished batch is one part (``weightgraft.resume.parts``: written atomically, so a run
killed at any moment loses at most the batch in flight), and ``identity.json`` is the folder's
claim (``weightgraft.resume.claim``). ``results.parquet`` is rebuilt from the parts in a
canonical order, so a resumed run yields the same file as an uninterrupted one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd

from weightgraft.errors import ResultsDirConflict as ResultsDirConflict
from weightgraft.errors import ResultsWriteError as ResultsWriteError
from weightgraft.resume.claim import Conflict, Identity, refuse_conflict
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import SweepClaim
from weightgraft.resume.parts import write_atomic as write_atomic

KEY = ("model_set", "template", "scheme", "example_id")
# What a row holds and how it was computed; a folder whose rows were written in an older format
# is refused rather than resumed (2: ``scored_on``, ``distractor_token``, ``logit_diff_flag``;
# a distractor logit difference between first tokens that begin each other's names is NaN;
# 3: ``fact_logprob``, the answer against the world's other answers).
ROWS_FORMAT = 3


class ResultsStore:
    """Parts under ``run_dir/parts``; ``identity.json`` (:class:`SweepClaim`) records what the
    rows depend on, claimed through the run folder's one rule
    (:meth:`~weightgraft.resume.folder.RunFolder.claim`).

    The claim is written with the first saved row, never before: a run that fails before
    computing anything leaves no claim on the directory.
    """

    def __init__(self, run_dir: Path, identity: SweepClaim, writer: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.folder = RunFolder(self.run_dir)
        self.parts = self.run_dir / "parts"
        # several processes write parts side by side, each its own, and read every one
        self._rows = self.folder.parts(f"part-{writer}-" if writer else "part-", shared="part-")
        self.identity = self.folder.claim(SweepClaim, identity, functools.partial(refusal, self.run_dir), write=False)
        self._written = False

    def add_model(self, model_set: str, role: str, weights_sha256: str) -> None:
        """Record a model's weights hash; refuse weights other than the ones earlier rows used."""
        known = self.identity.models.get(model_set, {})
        now = Identity(self.identity.rows_format, self.identity.core, {f"models/{model_set}": {role: weights_sha256}})
        refuse_conflict(self.identity.claim(), now, functools.partial(refusal, self.run_dir))
        if role not in known:
            self.identity.models[model_set] = {**known, role: weights_sha256}
            self._written = False

    def _claim(self) -> None:
        if self._written:
            return
        try:
            self.parts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsWriteError(exc.errno, f"cannot create results directory {self.parts}: {exc.strerror}") from exc
        self.folder.write(self.identity)
        self._written = True

    def read(self) -> pd.DataFrame:
        return self._rows.read()

    def done(self) -> set[tuple]:
        return self._rows.keys(KEY)

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        self._claim()
        self._rows.add(pd.DataFrame(rows))

    def consolidate(self, order: Iterable[tuple]) -> pd.DataFrame:
        """``results.parquet`` in the canonical order ``order`` (keys); duplicates refused."""
        frame = self.read()
        if frame.empty:
            return frame
        keys = list(frame[list(KEY)].itertuples(index=False, name=None))
        if len(set(keys)) != len(keys):
            raise RuntimeError(f"duplicate result rows in {self.parts}; this is a bug, please report it")
        rank = {key: i for i, key in enumerate(order)}
        frame["_rank"] = [rank.get(k, -1) for k in keys]
        # rows of an earlier, larger run of this folder that this command does not ask for stay
        # in the parts, out of results.parquet
        frame = frame[frame["_rank"] >= 0]
        frame = frame.sort_values("_rank", kind="stable").drop(columns="_rank").reset_index(drop=True)
        write_atomic(self.run_dir / "results.parquet", frame.to_parquet(index=False))
        return frame


def refusal(run_dir: Path, problem: Conflict) -> str:
    """A sweep's one line for a folder that is not this run (``core``: settings that change every
    number: dtype, seed, models' specs, ...; an entry: a scheme's definition, a prompt's content,
    a model's weights)."""
    afresh = f"results are never mixed: pass another out=... or delete {run_dir} to start afresh"
    if problem.what == "format":
        return (f"{run_dir} holds rows in format {problem.found} (an earlier weightgraft); this one writes format "
                f"{problem.now}, which scores answers differently; {afresh}")
    if problem.what == "core":
        return (f"{run_dir} holds results of another experiment config (a setting that changes every row differs: "
                f"models, dtype, seed, score_answer, target or data folder); {afresh}")
    if problem.kind.startswith("models/"):
        role, found, now = problem.names[0], cast(dict, problem.found), cast(dict, problem.now)
        return (f"{run_dir} holds rows computed with other weights for model {role!r} of model set "
                f"{problem.kind.removeprefix('models/')!r} (weights sha256 {found[role][:12]}..., "
                f"now {now[role][:12]}...); results are never mixed: pass another out=... or delete the folder "
                "to start afresh")
    label = {"schemes": "scheme definition(s)", "examples": "test prompt(s)"}.get(problem.kind, problem.kind)
    shown = ", ".join(problem.names[:3]) + (" ..." if len(problem.names) > 3 else "")
    return (f"{run_dir} holds rows computed from {len(problem.names)} {label} that have changed since ({shown}); "
            f"{afresh}")
