"""Experiment configs: YAML validated with pydantic, ``key=value`` overrides, scheme presets
expanded before any model is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, model_validator

from weightgraft.configfile import ConfigError, RunInputs
from weightgraft.experiments.pairs import SchemePair, check_pairs
from weightgraft.models.spec import ModelSpec, SpecText, parse_spec
from weightgraft.schemes.presets import preset
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, ProtocolName
from weightgraft.schemes.scheme import Scheme, with_scaled_roles


class PresetRef(BaseModel):
    """``{preset: position, direction: sft2pre, ...params}`` expands to a family of schemes."""

    model_config = ConfigDict(extra="allow")

    preset: str
    direction: str | None = None
    only: list[str] | None = None  # keep only these scheme names of the family

    def expand(self, protocol: str = DEFAULT_PROTOCOL) -> list[Scheme]:
        params = dict(self.model_extra or {})
        if self.direction is not None:
            params["direction"] = self.direction
        schemes = preset(self.preset, protocol=protocol, **params)
        if self.only is not None:
            names = {s.name for s in schemes}
            unknown = [n for n in self.only if n not in names]
            if unknown:
                raise ConfigError(f"preset {self.preset!r} has no scheme {unknown}; it has {sorted(names)}")
            schemes = [s for s in schemes if s.name in self.only]
        return schemes


def _scheme_kind(entry: Any) -> str:
    """A ``schemes:`` entry with a ``preset`` key is a preset reference, any other a scheme,
    so that an error names the fields of the kind the user wrote, not of both."""
    if isinstance(entry, dict):
        return "preset" if "preset" in entry else "scheme"
    return "preset" if isinstance(entry, PresetRef) else "scheme"


SchemeEntry = Annotated[
    Annotated[PresetRef, Tag("preset")] | Annotated[Scheme, Tag("scheme")], Discriminator(_scheme_kind)
]


class GenerateSpec(BaseModel):
    """Grafted continuations shown in the report: the first ``n_examples`` prompts per model
    set, every scheme (or ``schemes``), greedy."""

    model_config = ConfigDict(extra="forbid")

    n_examples: int = Field(2, ge=1, le=50)
    max_new_tokens: int = Field(12, ge=1, le=200)
    schemes: list[str] | None = None


class TrajectorySpec(BaseModel):
    """``trajectory: {role: sft}``: the sweep runs once per snapshot that ``models.ROLE``'s
    finetune kept (``weightgraft train --save-every N``), each as the model set ``step-NNNNNN``
    with ``ROLE`` served by that snapshot; ``steps`` keeps only those steps. The config checks
    what it says (a role of ``models``, a finetune's folder); the snapshots are read from that
    folder by :meth:`ExperimentConfig.snapshots`, which the run's preflight calls first, so a
    step not saved or another base is one line before any model loads."""

    model_config = ConfigDict(extra="forbid")

    role: str = "sft"
    steps: list[int] | None = None


class ExperimentConfig(RunInputs):
    """One sweep: a dataset's test prompts x schemes x model sets (the dataset, prompts, device,
    seed, tokenizer and output as every pipeline reads them: :class:`RunInputs`)."""

    what = "experiment"

    name: str = "experiment"
    # role -> model spec (directory, .gguf, embedded name); or several named model sets.
    models: dict[str, SpecText] | None = None
    model_sets: dict[str, dict[str, SpecText]] | None = None
    schemes: list[SchemeEntry] = Field(min_length=1)
    # "paper": the paper's text; "authors": what the authors' code computes
    # (weightgraft.schemes.protocol lists every difference)
    protocol: ProtocolName = DEFAULT_PROTOCOL
    groups: list[str] | None = None
    score_answer: bool = True  # also the log-probability of every answer token
    batch_size: int = Field(64, ge=1)
    # donors hold only the tensors some scheme grafts (read lazily from safetensors)
    lean_donors: bool = True
    # positions that several rows of a batch share are computed once (a KV cache per prefix)
    prefix_sharing: bool = True
    # spread each model's layers over several GPUs ("auto", as in from_pretrained); donors
    # then load in full with the same placement
    device_map: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # paired differences between two schemes on the same examples (summary_pairs.csv)
    pairs: list[SchemePair] = Field(default_factory=list)
    generate: GenerateSpec | None = None  # grafted continuations (continuations.csv)
    trajectory: TrajectorySpec | None = None  # one model set per snapshot of a finetune

    _specs: dict[str, dict[str, ModelSpec]] = PrivateAttr(default_factory=dict)
    _steps: dict[str, tuple[int, str]] | None = PrivateAttr(default=None)  # the trajectory's, once read

    @model_validator(mode="after")
    def _one_kind_of_models(self) -> ExperimentConfig:
        if (self.models is None) == (self.model_sets is None):
            raise ValueError("give exactly one of 'models' (role -> spec) or 'model_sets'")
        if self.trajectory is not None:
            _check_trajectory(self.models, self.trajectory)
        self._specs = {name: {role: parse_spec(text) for role, text in roles.items()}
                       for name, roles in self._written_sets().items()}  # each text checked by SpecText
        return self

    def _written_sets(self) -> dict[str, dict[str, str]]:
        """The model sets as the config writes them (a trajectory's snapshots not read: every
        snapshot's set has these roles)."""
        return self.model_sets if self.model_sets is not None else {"default": dict(self.models or {})}

    @staticmethod
    def field_path(loc: tuple[Any, ...]) -> str:
        """A bad key's path as the user wrote it: the union's tag ("preset" / "scheme") that
        follows a schemes entry's index is not a key of the config."""
        return ".".join(str(x) for i, x in enumerate(loc)
                        if not (i >= 2 and loc[i - 2] == "schemes" and isinstance(loc[i - 1], int)
                                and x in ("preset", "scheme")))

    def check_whole(self) -> None:
        self.resolved_schemes()

    def snapshots(self) -> dict[str, tuple[int, str]]:
        """``step-NNNNNN`` -> (step, snapshot folder) of the trajectory's finetune (empty without
        ``trajectory``), read from its folder once (never while the config is validated: the
        run's preflight reads it first); a step not saved, or snapshots of another base than
        ``models.pre``: :class:`ConfigError`, one line."""
        if self.trajectory is None:
            return {}
        if self._steps is None:
            self._steps = _snapshot_sets(self.models or {}, self.trajectory)
        return self._steps

    def sets(self) -> dict[str, dict[str, str]]:
        """Model set -> role -> the spec as written (what manifests and identities record); with
        ``trajectory``, one set per snapshot (:meth:`snapshots`)."""
        if self.trajectory is not None:
            role = self.trajectory.role
            return {name: {**(self.models or {}), role: folder} for name, (_, folder) in self.snapshots().items()}
        return self._written_sets()

    def set_steps(self) -> dict[str, int]:
        """Model set -> the training step of its snapshot (empty without ``trajectory``)."""
        return {name: step for name, (step, _) in self.snapshots().items()}

    def spec_sets(self) -> dict[str, dict[str, ModelSpec]]:
        """Model set -> role -> typed spec, parsed once when the config was validated, with the
        scaled roles (``scaled(ROLE, S)``) that the schemes' scaled rules need added."""
        texts = self.sets()
        if {n: {r: s.text for r, s in roles.items()} for n, roles in self._specs.items()} != texts:
            self._specs = {n: {r: parse_spec(t) for r, t in roles.items()} for n, roles in texts.items()}  # edited since
        schemes = self.resolved_schemes()
        return {n: with_scaled_roles(roles, schemes) for n, roles in self._specs.items()}

    def resolved_schemes(self) -> list[Scheme]:
        out: list[Scheme] = []
        for i, entry in enumerate(self.schemes):
            try:
                out.extend(entry.expand(self.protocol) if isinstance(entry, PresetRef) else [entry])
            except ValueError as exc:
                raise ConfigError(f"schemes.{i}: {exc}") from exc
        seen: set[str] = set()
        for s in out:
            if s.name in seen:
                raise ConfigError(f"scheme name {s.name!r} appears twice; scheme names must be unique")
            seen.add(s.name)
        names = [s.name for s in out]
        try:
            check_pairs(self.pairs, names)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        unknown = [n for n in (self.generate.schemes or []) if n not in names] if self.generate else []
        if unknown:
            raise ConfigError(f"generate.schemes: {unknown} are not in the sweep (it has {sorted(names)})")
        for set_name, roles in self._written_sets().items():  # a trajectory's sets have its roles
            for s in out:
                missing = s.named_roles() - set(roles)
                if missing:
                    raise ConfigError(
                        f"scheme {s.name!r} needs model role(s) {sorted(missing)} that model set "
                        f"{set_name!r} does not define (it has {sorted(roles)})"
                    )
        return out

    # excluded from every identity: where and how fast a run computes, not what
    PLACE: ClassVar[frozenset[str]] = frozenset({"batch_size", "out", "report", "device", "device_map", "lean_donors",
                                                 "prefix_sharing"})

    def identity_core(self) -> str:
        """Hash of the settings every row depends on; what selects rows (schemes, filters,
        limit, which snapshots run) is left out, so a rerun that only adds work extends the run."""
        trajectory = None if self.trajectory is None else {"role": self.trajectory.role}
        return self.identity(set(self.PLACE | {"schemes", "templates", "directions", "groups", "limit", "name"}),
                             late=("tokenizer", "trajectory"), trajectory=trajectory)

    def identity(self, exclude: set[str] | None = None, late: Sequence[str] = ("protocol", "tokenizer", "trajectory"),
                 **replaced: Any) -> str:
        """Hash of what determines the results (not batch size, device or output place), every
        scheme as it expands; with ``exclude``, :meth:`RunInputs.identity` itself."""
        if exclude is not None:
            return super().identity(exclude, late, **replaced)
        schemes = [s.model_dump(mode="json") for s in self.resolved_schemes()]
        return super().identity(set(self.PLACE), late, schemes=schemes)


def _check_trajectory(models: dict[str, str] | None, trajectory: TrajectorySpec) -> Path:
    """What the config itself says of its trajectory (no file is read): ``role`` is a role of
    ``models`` whose spec is a finetune's folder; that folder."""
    if models is None or trajectory.role not in models:
        raise ValueError(f"trajectory.role {trajectory.role!r} must be a role of 'models' (not model_sets)")
    spec = parse_spec(models[trajectory.role])
    if spec.folder is None:
        raise ValueError(f"trajectory: models.{trajectory.role} must be a finetune's folder, got {spec.text!r}")
    return spec.folder


def _snapshot_sets(models: dict[str, str], trajectory: TrajectorySpec) -> dict[str, tuple[int, str]]:
    """``step-NNNNNN`` -> (step, snapshot folder) of the finetune ``models[role]`` names, read
    from its folder (:class:`ConfigError` in one line where it cannot serve)."""
    from weightgraft.training.trajectory import read_trajectory

    root = _check_trajectory(models, trajectory)
    try:
        snaps = read_trajectory(root)
    except ValueError as exc:
        raise ConfigError(f"trajectory: {exc}") from None
    missing = sorted(set(trajectory.steps or []) - {s.step for s in snaps})
    if missing:
        raise ConfigError(f"trajectory.steps {missing} were not saved (saved: {[s.step for s in snaps]})")
    _same_base(models, root)
    return {f"step-{s.step:06d}": (s.step, str(root / s.folder)) for s in snaps
            if trajectory.steps is None or s.step in trajectory.steps}


def _same_base(models: dict[str, str], root: Path) -> None:
    """The snapshots were trained from ``models.pre`` (the finetune's recorded base spec, read
    as a path where it is one), or the run is refused before anything loads."""
    import json

    recorded = json.loads((root / "training_run.json").read_text(encoding="utf-8")).get("base_model") if (
        root / "training_run.json").is_file() else None
    pre = models.get("pre")
    if recorded is None or pre is None:
        return

    def same(a: str, b: str) -> bool:
        pa, pb = Path(a).expanduser(), Path(b).expanduser()
        return pa.resolve() == pb.resolve() if pa.exists() and pb.exists() else a.strip().lower() == b.strip().lower()

    if not same(str(recorded), pre):
        raise ConfigError(f"trajectory: {root} was finetuned from {recorded!r}, not from models.pre {pre!r}: "
                          "its snapshots would be grafted into another base")


def parse_config(raw: dict[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> ExperimentConfig:
    """Validate a raw dict; relative paths are taken from ``base_dir`` (the YAML's folder)."""
    return ExperimentConfig.parse(raw, source, base_dir)


def load_config(path: Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment YAML."""
    return ExperimentConfig.load(path, overrides)
