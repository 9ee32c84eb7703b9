"""The records of every pipeline's folder, typed: what ``report/`` and ``explore/`` read and what
:class:`~weightgraft.resume.folder.RunFolder` claims and writes.

Each reads every folder an earlier weightgraft wrote: a key it lacks takes its default (the
value that version meant), a key this one does not declare is kept as it is.

- :class:`SweepClaim`: a sweep's ``identity.json`` (what its rows depend on);
- :class:`SweepManifest`: a sweep's ``manifest.json`` (what a finished session recorded);
- :class:`LocalizeManifest`: localize's ``manifest.json`` (its claim and what the run found out);
- :class:`StageRecord`: a stage's ``stage.json`` (its key, inputs and outputs, typed by the
  stage: ``StageRecord[FinetuneOutputs]``);
- :class:`FolderStages`: ``stages.json``, the keyed stages inside a claimed folder (localize's
  search and stability), each a :class:`StageRecord`;
- :class:`SearchRecord`: localize's ``search.json`` (the found sets), which ``explore`` and the
  report read;
- :class:`ExpertsManifest`: an expert map's ``manifest.json`` (format ``weightgraft.experts/1``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import ConfigDict, Field, model_validator

from weightgraft.resume.claim import Identity
from weightgraft.resume.folder import Record

__all__ = ["EXPERTS_FORMAT", "ExpertsManifest", "FolderStages", "Json", "LocalizeManifest", "ModelEntry",
           "SearchRecord", "Session", "StageFiles", "StageRecord", "SweepClaim", "SweepManifest"]

Json = dict[str, Any]  # a JSON object the record keeps as written (a config, a scheme)
Out = TypeVar("Out", bound=Record)  # a stage's outputs


class SweepClaim(Record):
    """``identity.json``: the rows' format, the core digest, each scheme's and prompt's digest,
    each model's weights by model set and role, and the config that wrote them."""

    FILE: ClassVar[str] = "identity.json"
    SORT_KEYS: ClassVar[bool] = True

    rows_format: int = 1
    core: str | None = None
    schemes: dict[str, str] = Field(default_factory=dict)
    examples: dict[str, str] = Field(default_factory=dict)
    models: dict[str, dict[str, str]] = Field(default_factory=dict)
    config: Json = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _earliest(cls, data: Any) -> Any:
        """Written by the earliest weightgraft: the whole config's digest only (format 1)."""
        if isinstance(data, dict) and "core" not in data and "identity" in data:
            return {"core": data["identity"]}
        return data

    def claim(self) -> Identity:
        models = {f"models/{name}": roles for name, roles in self.models.items()}
        return Identity(self.rows_format, self.core, {"schemes": self.schemes, "examples": self.examples, **models})

    def claimed(self, identity: Identity, now: Self) -> Self:
        entries = identity.entries
        models = {k.removeprefix("models/"): dict(v) for k, v in entries.items() if k.startswith("models/")}
        return type(self)(rows_format=identity.format, core=identity.core, schemes=dict(entries.get("schemes", {})),
                          examples=dict(entries.get("examples", {})), models=models, config=now.config)


class ModelEntry(Record):
    """A model a run loaded: its spec as written, where it came from, its weights' hash (and,
    by pipeline, its depth, memory, adapter)."""

    spec: str = ""
    source: str = ""
    weights_sha256: str = ""
    n_layers: int | None = None


class Session(Record):
    """One invocation's timing (a rerun adds its own)."""

    started: str = ""
    finished: str = ""
    wall_seconds: float = 0.0
    computed_this_run: int = 0
    interrupted: bool = False


class SweepManifest(Record):
    """``manifest.json`` of a sweep, written when a session finishes."""

    FILE: ClassVar[str] = "manifest.json"

    name: str = ""
    identity: str | None = None
    protocol: str = "paper"
    config: Json = Field(default_factory=dict)
    schemes: list[Json] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)
    models: dict[str, dict[str, ModelEntry]] = Field(default_factory=dict)  # model set -> role -> entry
    model_set_steps: dict[str, int] = Field(default_factory=dict)
    device: str = ""
    dtype: str = ""
    seed: int | None = None
    exclusions: Json = Field(default_factory=dict)
    n_rows: int = 0
    n_partial_target: int = 0
    n_weak_first_token: int = 0
    computed_this_run: int = 0
    processes: int = 1
    batches_split_on_oom: int = 0
    started: str = ""
    finished: str = ""
    wall_seconds: float = 0.0
    sessions: list[Session] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _one_level(cls, data: Any) -> Any:
        """Models written one level deep (role -> entry): one unnamed model set."""
        models = data.get("models") if isinstance(data, dict) else None
        if isinstance(models, dict) and any(isinstance(v, dict) and "source" in v for v in models.values()):
            return {**data, "models": {"": models}}
        return data


def spec_list(config: Json, role: str) -> list[str]:
    """The specs a localize config's ``models.ROLE`` names (one or a list), in order."""
    specs = (config.get("models") or {}).get(role)
    return [specs] if isinstance(specs, str) else list(specs or [])


class LocalizeManifest(Record):
    """``manifest.json`` of a localize run: its claim (the config's identity, each prompt's digest,
    the label version of its cells) and what the run found out (directions, prompt counts, the
    models it mapped)."""

    FILE: ClassVar[str] = "manifest.json"

    identity: str | None = None
    config: Json = Field(default_factory=dict)
    examples: dict[str, str] = Field(default_factory=dict)
    labels: int = 1  # cells named by position labels of this version
    directions: list[str] | None = None
    directions_note: str | None = None
    excluded: list[Json] = Field(default_factory=list)
    n_prompts: dict[str, int] = Field(default_factory=dict)
    prompt_directions: list[str] = Field(default_factory=list)
    sft_models: list[str] = Field(default_factory=list)
    null_models: list[str] = Field(default_factory=list)
    search_model: str | None = None
    models: dict[str, ModelEntry] = Field(default_factory=dict)  # label -> entry
    adapters: dict[str, Json] = Field(default_factory=dict)  # label -> a LoRA donor's adapter
    adapter: Json | None = None  # the first SFT model's adapter

    def claim(self) -> Identity:
        """Its claim (the lists: the SFT and null models as the config named them)."""
        return Identity(self.labels, self.identity, {"examples": self.examples},
                        {"sft": spec_list(self.config, "sft"), "nulls": spec_list(self.config, "nulls")})

    def claimed(self, identity: Identity, now: Self) -> Self:
        return self.updated(identity=now.identity, config=now.config, examples=dict(identity.entries["examples"]),
                            labels=identity.format)


class StageRecord(Record, Generic[Out]):
    """``stage.json``: a finished stage's key (the digest of its kind and inputs), its inputs,
    its outputs (names under its folder, and values; typed by the stage: ``StageRecord[Out]``),
    how long it took."""

    FILE: ClassVar[str] = "stage.json"
    INDENT: ClassVar[int] = 1
    SORT_KEYS: ClassVar[bool] = True

    format: str = ""
    kind: str = ""
    name: str = ""
    key: str = ""
    inputs: Json = Field(default_factory=dict)
    outputs: Out
    seconds: float = 0.0
    finished: str = ""


class StageFiles(Record):
    """The outputs of a stage inside a claimed folder: its files there."""

    files: list[str] = Field(default_factory=list)


class FolderStages(Record):
    """``stages.json``: the keyed stages inside a claimed folder by name (localize's ``search``
    and ``stability``), each the record of its last finish; a stage whose inputs changed since
    has another key, so it is computed again."""

    FILE: ClassVar[str] = "stages.json"
    INDENT: ClassVar[int] = 1
    SORT_KEYS: ClassVar[bool] = True

    stages: dict[str, StageRecord[StageFiles]] = Field(default_factory=dict)


class SearchRecord(Record):
    """localize's ``search.json``: per (direction, template) the found set, its refinement,
    controls, missed-effects estimate and held-out shares (``searches``, each entry as written),
    each template's split of its prompts (``splits``), the metric and ranking column, and the
    mapped model it was searched on. A run without the search has none (``searches`` empty).
    A value that is not a number (a share of no effect) is written as JSON's ``NaN``, as it
    always was."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")
    FILE: ClassVar[str] = "search.json"

    metric: str = ""
    rank_by: str = ""
    searches: list[Json] = Field(default_factory=list)
    splits: dict[str, Json] = Field(default_factory=dict)
    model: str | None = None


EXPERTS_FORMAT = "weightgraft.experts/1"


class ExpertsManifest(Record):
    """An expert map's ``manifest.json`` (``weightgraft experts``): its format, settings (the
    base, the donors in order, data, templates, direction, prompt cap, metric, seed), prompt
    counts, the models loaded and the package versions."""

    FILE: ClassVar[str] = "manifest.json"

    format: str = ""
    pre: str = ""
    donors: dict[str, str] = Field(default_factory=dict)
    data: str = ""
    out: str = ""
    templates: list[str] = Field(default_factory=list)
    direction: str = ""
    prompts: int | None = None
    metric: str = ""
    seed: int | None = None
    record: Json = Field(default_factory=dict)
    n_prompts: dict[str, int] = Field(default_factory=dict)
    prompts_left_out: int | None = None
    models: dict[str, ModelEntry] = Field(default_factory=dict)  # label -> entry
    versions: dict[str, str] = Field(default_factory=dict)
