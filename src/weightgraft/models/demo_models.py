"""The models ``weightgraft demo`` made, by name: ``demo`` (or ``demo:sft``) is its finetune and
``demo:pre`` its base model, so that a notebook, a config or ``explore`` can name them without the
cache's hashed path (``$WEIGHTGRAFT_CACHE/demo/sft-<hash>``).

Why a record: the finetune's folder name is a hash of the data and settings, known only once the
demo has run. The demo (default model, whole finetune) writes ``demo/last.json`` under the cache
when it finishes; a demo run by an older weightgraft is found through its run's manifest
(``runs/demo/run/manifest.json`` from the working directory).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from weightgraft import atomic
from weightgraft.models.errors import DemoNotFoundError as DemoNotFoundError
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import SweepManifest

__all__ = ["DemoNotFoundError", "DemoRecord", "demo_target", "read_demo_record", "record_path", "write_demo_record"]
_CALL = re.compile(r"^\s*\w+\s*\(")  # a spec built from roles (peft(...)), not a folder
DEMO_RUN = Path("runs/demo/run")  # where `weightgraft demo` writes its sweep (weightgraft.demo.demo_out)
RECORD_FORMAT = "weightgraft.demo/1"


@dataclass(frozen=True)
class DemoRecord:
    """What the last demo made: its base model's spec, its finetune's directory, its run."""

    pre: str
    sft: Path
    run: Path | None  # the sweep's directory (results, report), absolute

    @property
    def report(self) -> Path | None:
        """The HTML report of the demo's sweep."""
        return None if self.run is None else self.run / "report" / "report.html"


def record_path() -> Path:
    """``$WEIGHTGRAFT_CACHE/demo/last.json``: the record of the last default demo."""
    from weightgraft.models.embedded import cache_root

    return cache_root() / "demo" / "last.json"


def write_demo_record(pre: str, sft: Path, run: Path) -> Path:
    """Record the demo's models and run (called by the demo once its report is written)."""
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps({"format": RECORD_FORMAT, "pre": pre, "sft": str(Path(sft).resolve()),
                                        "run": str(Path(run).resolve())}, indent=2) + "\n")
    return path


def _from_manifest(run: Path) -> DemoRecord | None:
    """The record a demo's run manifest implies (a demo that wrote no record)."""
    try:
        manifest = RunFolder(run).read(SweepManifest)
    except (OSError, ValueError):
        return None
    models = manifest.config.get("models") if manifest is not None else None
    if not isinstance(models, dict) or "pre" not in models or "sft" not in models:
        return None
    pre, sft = str(models["pre"]), Path(str(models["sft"])).expanduser()
    if _CALL.match(str(models["sft"])):
        return None  # a LoRA demo's donor is an adapter on a role, not a model directory
    return DemoRecord(pre=pre, sft=sft.resolve(), run=run.resolve())


def read_demo_record() -> DemoRecord | None:
    """The last demo's record, else what ``runs/demo/run``'s manifest says, else None."""
    try:
        raw: dict[str, Any] = json.loads(record_path().read_text())
        run = raw.get("run")
        return DemoRecord(pre=str(raw["pre"]), sft=Path(raw["sft"]), run=Path(run) if run else None)
    except (OSError, ValueError, KeyError, TypeError):
        return _from_manifest(DEMO_RUN)


def demo_target(role: Literal["sft", "pre"], name: str) -> str:
    """The spec text the demo's ``role`` (named ``name``: ``demo``, ``demo:sft``, ``demo:pre``)
    stands for: the finetune's directory or the base's spec. A demo name with no demo behind it
    is one line saying how to make it."""
    record = read_demo_record()
    name = name.strip()
    if record is None:
        raise DemoNotFoundError(f"{name!r} names the demo's models, but no demo has run here "
                                f"(no {record_path()}, no {DEMO_RUN}/manifest.json): run `make demo` or "
                                "`weightgraft demo` first")
    if role == "pre":
        return record.pre
    if not (record.sft / "config.json").is_file():
        raise DemoNotFoundError(f"{name!r}: the demo's finetune {record.sft} is gone from the cache; "
                                "run `make demo` or `weightgraft demo` again to train it")
    return str(record.sft)

