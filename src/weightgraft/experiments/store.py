"""The results store: one row per (model set, template, scheme, example), safe to kill.

Each finished batch is one part (``weightgraft.resume.parts``: written atomically, so a run
killed at any moment loses at most the batch in flight), and ``identity.json`` is the folder's
claim (``weightgraft.resume.claim``). ``results.parquet`` is rebuilt from the parts in a
canonical order, so a resumed run yields the same file as an uninterrupted one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.errors import ResultsDirConflict, ResultsWriteError as ResultsWriteError
from weightgraft.resume.claim import changed_entries
from weightgraft.resume.parts import Parts, write_atomic as write_atomic

KEY = ("model_set", "template", "scheme", "example_id")
# What a row holds and how it was computed; a folder whose rows were written in an older format
# is refused rather than resumed (2: ``scored_on``, ``distractor_token``, ``logit_diff_flag``;
# a distractor logit difference between first tokens that begin each other's names is NaN;
# 3: ``fact_logprob``, the answer against the world's other answers).
ROWS_FORMAT = 3


class ResultsStore:
    """Parts under ``run_dir/parts``; ``identity.json`` records what the rows depend on.

    The identity (see :func:`check_identity`) is written with the first saved row, never
    before: a run that fails before computing anything leaves no claim on the directory.
    """

    def __init__(self, run_dir: Path, identity: dict[str, Any], config: dict[str, Any], writer: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.parts = self.run_dir / "parts"
        # several processes write parts side by side, each its own, and read every one
        self._rows = Parts(self.parts, f"part-{writer}-" if writer else "part-", shared="part-")
        self.config = config
        owner = self.run_dir / "identity.json"
        found = _read_identity(owner)
        if found is not None:
            check_identity(found, identity, self.run_dir)
            identity = merge_identity(found, identity)
        self.identity = identity
        self._written = False

    def add_model(self, model_set: str, role: str, weights_sha256: str) -> None:
        """Record a model's weights hash; refuse weights other than the ones earlier rows used."""
        known = self.identity.setdefault("models", {}).setdefault(model_set, {})
        if known.get(role) not in (None, weights_sha256):
            raise ResultsDirConflict(
                f"{self.run_dir} holds rows computed with other weights for model {role!r} of model "
                f"set {model_set!r} (weights sha256 {known[role][:12]}..., now {weights_sha256[:12]}...); "
                "results are never mixed: pass another out=... or delete the folder to start afresh"
            )
        if role not in known:
            known[role] = weights_sha256
            self._written = False

    def _claim(self) -> None:
        if self._written:
            return
        try:
            self.parts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsWriteError(exc.errno, f"cannot create results directory {self.parts}: {exc.strerror}") from exc
        body = {**self.identity, "config": self.config}
        write_atomic(self.run_dir / "identity.json", json.dumps(body, indent=2, sort_keys=True).encode())
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


def _read_identity(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    found = json.loads(path.read_text())
    if "core" not in found:  # written by an earlier weightgraft: the whole config hash only
        found = {"core": found.get("identity"), "schemes": {}, "examples": {}, "models": {}}
    return found


def check_identity(found: dict[str, Any], wanted: dict[str, Any], run_dir: Path) -> None:
    """Refuse when rows already saved depend on inputs that changed; adding work is fine.

    ``core`` (settings that change every number: dtype, seed, models' specs, ...) must match;
    a scheme or example present in both must have the same definition / content.
    """
    afresh = f"results are never mixed: pass another out=... or delete {run_dir} to start afresh"
    if found.get("rows_format", 1) != wanted.get("rows_format", 1):
        raise ResultsDirConflict(
            f"{run_dir} holds rows in format {found.get('rows_format', 1)} (an earlier weightgraft); this "
            f"one writes format {wanted.get('rows_format', 1)}, which scores answers differently; {afresh}"
        )
    if found.get("core") != wanted["core"]:
        raise ResultsDirConflict(
            f"{run_dir} holds results of another experiment config (a setting that changes every "
            f"row differs: models, dtype, seed, score_answer, target or data folder); {afresh}"
        )
    for what, label in (("schemes", "scheme definition(s)"), ("examples", "test prompt(s)")):
        changed = changed_entries(found.get(what, {}), wanted.get(what, {}))
        if changed:
            shown = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
            raise ResultsDirConflict(
                f"{run_dir} holds rows computed from {len(changed)} {label} that have changed since "
                f"({shown}); {afresh}"
            )


def merge_identity(found: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """The identity of a folder after this command adds its work to what it holds."""
    models = {k: dict(v) for k, v in found.get("models", {}).items()}
    return {
        **({"rows_format": wanted["rows_format"]} if "rows_format" in wanted else {}),
        "core": wanted["core"],
        "schemes": {**found.get("schemes", {}), **wanted.get("schemes", {})},
        "examples": {**found.get("examples", {}), **wanted.get("examples", {})},
        "models": models,
    }
