"""``localize``: cell maps (attribution estimates, exact effects) and minimal graft sets of a
model pair on a dataset (a dataset folder or a free-form JSONL, as ``run`` reads them),
written to a run directory (``out``, else ``runs/{name}``) and resumed from it.

Stages, each written when finished (a rerun skips what exists): ``parts/estimates_{direction}
.parquet`` (and ``_{n}`` parts of prompts added later) and ``parts/exact_{direction}_{n}.parquet``
per group of prompts (``exact_parts``: keyed by prompt, so a killed run, a raised ``exact:`` or
prompts added to the data compute only the prompts no part holds); ``cells.parquet``
(both joined); ``search.json`` (``found_sets``: search on fit prompts, refinement, controls,
missed-effects estimate, held-out shares) and ``stability.csv`` (``stability``), keyed stages of the
folder (``stages.json`` holds their keys: a rerun with the same inputs reads them back, one with
other maps or prompts computes them again); ``parts/claims_*`` per SFT model
and direction, and ``claims.csv`` / ``claims_prompts.parquet`` (``claims.stage``: the claims as exact
region grafts against their null, on the SFT and the null models; with ``reversal:``, claims 4-5 in the paper's setting,
``claims.reversal``); ``report/`` (drawn by ``weightgraft.api.pipelines.localize``, since ``report``
builds on this package). Without ``directions``, the prompts of the trained direction
(``prompts``).

Several SFT models (``models: {pre: X, sft: [A, B, C]}``, e.g. training seeds) are loaded one
at a time, each mapped against ``pre``; ``cells.parquet``'s ``model`` column names each one's
rows (``sft``, or ``sft[i]`` for a list). The first SFT model's parts stay in ``parts/``, the
i-th's in ``parts/sft{i}/``. The found sets are searched for the first SFT model only (each
search costs minutes on a real pair); ``stability.csv`` compares the maps of SFT models and
of templates (``stability``). Appending SFT models to the list extends a run.

Null models (``models: {..., nulls: [D, E]}``: finetunes of the same recipe that do not hold the
prompts' facts) are mapped after the SFT models in the same way (labels ``null[j]``, parts in
``parts/null{j}/``; no claims, no search); ``stability.csv`` compares each with the SFT models
(``sft_vs_null``) and ``stability_null.csv`` says whether the SFT models agree with each other
more than with a null (``stability.null_summary``). Appending null models extends a run.
"""

from __future__ import annotations

import functools
import gc
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from weightgraft import atomic
from weightgraft.configfile import ConfigError, json_digest
from weightgraft.data.prompts import DatasetError, TestPrompt
from weightgraft.engine.architectures import Units
from weightgraft.engine.partial import PartialGraft
from weightgraft.localization.claims import NULL_FINETUNE, PRE_SFT
from weightgraft.localization.claims.evidence import claims_evidence
from weightgraft.localization.claims.reversal import reversal_claims
from weightgraft.localization.claims.stage import map_claims, write_claims
from weightgraft.localization.claims.steps import claims_along_steps, snapshot_steps
from weightgraft.localization.config import CONTROL, LocalizeConfig
from weightgraft.localization.exact_parts import estimates_stage, exact_stage
from weightgraft.localization.examples import LocalizeExample, build_examples
from weightgraft.localization.found_sets import search_stage
from weightgraft.localization.maps import blank_frame, estimate_frame, unit_picks, whole_cells
from weightgraft.localization.plan_input import plan_input
from weightgraft.localization.prompts import DirectionChoice, localize_prompts
from weightgraft.localization.stability import stability_stage
from weightgraft.models.donors import LoadSettings, load_member, load_role
from weightgraft.models.errors import PeftError
from weightgraft.models.loaded import LoadedModel, Loader
from weightgraft.models.spec import PeftSpec, check_roles, parse_peft, parse_spec
from weightgraft.planning.localize import plan_localize_work, refuse_estimates
from weightgraft.planning.preflight import preflight
from weightgraft.resume.claim import Conflict
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import LocalizeManifest, ModelEntry, SearchRecord
from weightgraft.schemes.labels import LABEL_VERSION


@dataclass
class LocalizeResult:
    run_dir: Path
    cells: pd.DataFrame
    search: SearchRecord
    excluded: list[dict[str, str]]
    seconds: dict[str, float]
    report: Path | None = None  # report/index.html, None with report: false
    directions_note: str = ""  # which prompt directions were mapped, and why


def _digests(prompts: list[TestPrompt]) -> dict[str, str]:
    """Per prompt (template/id), a digest of its content: rows of a changed prompt are never mixed in."""
    import dataclasses

    return {f"{p.template}/{p.id}": json_digest(dataclasses.asdict(p)) for p in prompts}


def _refusal(run_dir: Path, problem: Conflict) -> str:
    """Localize's one line for a folder that is not this run."""
    if problem.what == "format":  # its cells are keyed by labels that name other tokens
        return (f"{run_dir} holds cells named by position labels of version {problem.found} (a span's last token "
                f"was the span's name); this version names them '{{span}}_last' (labels {problem.now}); choose "
                "another 'out' or delete the folder")
    if problem.what == "core":
        return f"{run_dir} holds a localize run of another config; choose another 'out' or 'name'"
    if problem.what == "list":
        what = {"sft": "SFT", "nulls": "null"}[problem.kind]
        return (f"{run_dir} holds maps of the {what} models {problem.found}; a config may append {what} models to "
                "that list, not change or drop them; choose another 'out' or 'name'")
    return (f"{run_dir} holds cells of {len(problem.names)} prompt(s) whose content has changed "
            f"({', '.join(problem.names[:3])}); choose another 'out' or delete the folder")


def _same_config(config: LocalizeConfig, old: LocalizeManifest) -> bool:
    """The stored config's identity under today's rules (so 'exact' may differ); the stored
    identity where today's rules cannot read the stored config."""
    try:
        return LocalizeConfig.model_validate(old.config).identity() == config.identity()
    except ValueError:
        return old.identity == config.identity()


def _claim(run_dir: Path, config: LocalizeConfig, prompts: list[TestPrompt]) -> None:
    """A run directory belongs to one config (``exact`` aside: raising it extends the run, and
    SFT models appended to the list extend it too); resuming with another, with the SFT list
    changed or shortened, or with prompts whose content changed, is refused."""
    now = LocalizeManifest(identity=config.identity(), config=config.model_dump(mode="json"),
                           examples=_digests(prompts), labels=LABEL_VERSION)
    RunFolder(run_dir).claim(LocalizeManifest, now, functools.partial(_refusal, run_dir),
                             same_core=functools.partial(_same_config, config))
    (run_dir / "parts").mkdir(parents=True, exist_ok=True)


def _check_peft(config: LocalizeConfig) -> list[PeftSpec | None]:
    """``sft: peft(pre, DIR)`` (a LoRA donor on the pair's base), checked before loading; one
    adapter spec (or None) per mapped model (SFT models, then null models)."""

    roles = config.role_specs()
    check_roles(roles, "models")
    specs = [parse_peft(text) for _, text in config.mapped_models()]
    if parse_peft(roles["pre"]) is not None or any(s is not None and s.base != "pre" for s in specs):
        raise PeftError("models: a LoRA donor is the 'sft' model, on the base 'pre': sft: peft(pre, DIR)")
    return specs


def _claims_by_step(config: LocalizeConfig, judged: pd.DataFrame, run_dir: Path, say: Callable[[str], None]) -> None:
    """``claims_steps.csv`` where the SFT models are snapshots of one finetune: each claim's first
    held step; where only some are, or of several finetunes, none is written and the run says why."""
    specs = [(label, parse_spec(spec)) for label, spec in config.sft_models()]
    steps = snapshot_steps([(label, s.training_step, s.training_run) for label, s in specs])
    if isinstance(steps, str):
        if any(s.training_step is not None for _, s in specs):
            say(f"claims by step: not written ({steps})")
        return
    table = claims_along_steps(judged, steps)
    atomic.write_text(run_dir / "claims_steps.csv", table.to_csv(index=False))
    for _, r in table.iterrows():
        say(f"[{r['direction']}/{r['template']}] {r['claim']}: " + (
            f"holds from step {int(r['first_held'])} on" if pd.notna(r["first_held"]) else f"{r['last_verdict']} at the last step"))


def _parts_name(i: int, n_sft: int, label: str = "") -> str:
    """The parts folder of the i-th mapped model (not the first): ``sft{i}``, ``null{j}``, or
    ``control``."""
    if label == CONTROL:
        return CONTROL
    return f"sft{i}" if i < n_sft else f"null{i - n_sft}"


def _load_sft(spec: str, label: str, first: bool, *, pre: LoadedModel, adapter: PeftSpec | None,
              settings: LoadSettings, tokenizer: Any, folder: RunFolder) -> LoadedModel:
    """One donor: loaded by spec, or the LoRA adapter on ``pre`` (recorded in the manifest:
    ``adapters`` by label, and ``adapter`` for the first SFT model)."""
    if adapter is None:
        return load_member(spec, label, settings, tokenizer=tokenizer, base=pre)
    sft = load_member(adapter, label, settings, tokenizer=tokenizer, base=pre, loaded={"pre": pre})
    assert sft.adapter is not None
    info = sft.adapter.as_dict("pre")
    found = folder.read(LocalizeManifest)
    folder.update(LocalizeManifest, adapters={**(found.adapters if found else {}), label: info},
                  **({"adapter": info} if first else {}))
    return sft


def _model_info(spec: str, model: LoadedModel) -> ModelEntry:
    """A model's manifest entry; a LoRA donor's also names its adapter and its base, each by source
    and hash (the adapter's other details are recorded under ``adapters``)."""
    adapter = {} if model.adapter is None else model.adapter.identity()
    return ModelEntry.model_validate({"spec": spec, "source": model.source, "weights_sha256": model.weights_sha256,
                                      **adapter})


def _write(frame: pd.DataFrame, path: Path) -> None:
    with atomic.atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def _with_distractors(examples: list[LocalizeExample]) -> list[LocalizeExample]:
    """The next example of the same template with another first answer token (cyclic)."""
    by_template: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        by_template[e.prompt.template].append(i)
    out = list(examples)
    for idx in by_template.values():
        for k, i in enumerate(idx):
            target = examples[i].scored.target
            other = next((examples[idx[(k + d) % len(idx)]].scored.target for d in range(1, len(idx))
                          if examples[idx[(k + d) % len(idx)]].scored.target != target), None)
            if other is None:
                raise DatasetError(f"template {examples[i].prompt.template!r}: every answer starts with the "
                                   "same token; 'logit_diff' has no distractor")
            s = examples[i].scored
            out[i] = LocalizeExample(examples[i].prompt, replace(s, distractor=other), examples[i].labels)
    return out


def _exact_subset(config: LocalizeConfig, examples: list[LocalizeExample]) -> list[LocalizeExample]:
    if config.exact == "none":
        return []
    if config.exact == "all":
        return examples
    count: dict[str, int] = defaultdict(int)
    chosen = []
    for e in examples:
        if count[e.prompt.template] < config.exact:
            count[e.prompt.template] += 1
            chosen.append(e)
    return chosen


def _model_maps(config: LocalizeConfig, examples: list[LocalizeExample], pre: Any, *, sft: Any,
                pairs: dict[str, list[Any]], pad_id: int, parts: Path, stamp: str, say: Any,
                seconds: dict[str, float]) -> pd.DataFrame:
    """One SFT model's cells (estimates joined with exact effects) in every graft direction,
    each stage read from ``parts`` where a run already wrote it."""

    graft = PartialGraft(pre, sft) if config.estimates else None  # estimates: false: no partial graft at all
    frames = []
    tell = (lambda msg: say(f"[{stamp.rstrip('/')}] {msg}")) if stamp else say
    for direction in config.graft_directions:
        models = pairs[direction]
        t0 = time.time()

        def estimated(todo: list[LocalizeExample], direction: str = direction) -> pd.DataFrame:
            if graft is None:  # every cell's row, estimate NaN
                return blank_frame(pre, todo, direction)
            pair = graft if direction == "sufficiency" else graft.swapped()
            return estimate_frame(pair, todo, direction, metric=config.metric, batch_size=config.batch_size,
                                  ig_steps=config.ig_steps, units=config.units, unit_rows=config.unit_rows)

        estimates, computed = estimates_stage(examples, direction, metric=config.metric, parts=parts, make=estimated)
        what = "every cell" + ("" if computed == len(examples) else f" of {computed} prompt(s) no part holds")
        if computed and graft is None:
            tell(f"[{direction}] no estimates (estimates: false): every cell's row, estimate NaN")
        elif computed:
            seconds[f"{stamp}estimates_{direction}"] = time.time() - t0
            tell(f"[{direction}] estimates of {what}: {time.time() - t0:.1f}s")
        chosen = _exact_subset(config, examples)
        t0 = time.time()
        picks = unit_picks(estimates, examples, pre, config.units, config.exact_units) if config.units != Units.CELL else None
        exact_parts = exact_stage(models, chosen, direction, metric=config.metric, pad_id=pad_id, chunk=config.exact_chunk, parts=parts, say=tell,
                                  unit_cells=picks)
        if exact_parts:
            seconds[f"{stamp}exact_{direction}"] = time.time() - t0
            estimates = estimates.merge(pd.concat(exact_parts), on=["example_id", "template", "direction", "position", "slot", "unit"], how="left")
        else:
            estimates["exact"] = float("nan")
        frames.append(estimates)
    return pd.concat(frames, ignore_index=True)


@dataclass
class _Work:
    """What localize knows before a model loads: the config it runs (with the plan's batch
    size), its prompts, the reversal's, the directions chosen and why, the claims' evidence, each
    mapped model's adapter, the config's tokenizer."""

    config: LocalizeConfig
    prompts: list[TestPrompt]
    reversal: list[TestPrompt]
    choice: DirectionChoice
    warning: str | None
    adapters: list[PeftSpec | None]
    tokenizer: Any


def _preflight(config: LocalizeConfig, load: Loader | None) -> _Work:
    """Everything refused before a model loads: the data, claims that cannot reach a verdict,
    LoRA donors, then the one pre-load check (device, models, the plan)."""
    chosen = localize_prompts(config)
    evidence = claims_evidence(config, chosen.mapped, len(chosen.reversal)) if config.claims.enabled else None
    if evidence is not None and evidence.problem:
        raise ConfigError(evidence.problem)
    adapters = _check_peft(config)
    specs = config.role_specs()
    checked = preflight(config, {"models": specs}, specs, command="weightgraft localize", custom_loader=load is not None,
                        batch_size=config.batch_size,
                        plan=lambda: plan_localize_work(plan_input(config, chosen.mapped), with_time=False))
    if checked.batch_size != config.batch_size:
        config = config.model_copy(update={"batch_size": checked.batch_size})
    return _Work(config, chosen.mapped, chosen.reversal, chosen.choice, evidence.warning if evidence else None,
                 adapters, checked.tokenizer)


@dataclass
class _Localize:
    """One localize run in its claimed folder: the base loaded, the examples built, and what
    each mapped model adds (its cells, claims, the first one's found sets)."""

    work: _Work
    folder: RunFolder
    settings: LoadSettings
    say: Callable[..., None]
    pre: LoadedModel = field(init=False)
    examples: list[LocalizeExample] = field(init=False)
    excluded: list[dict[str, str]] = field(init=False)
    seconds: dict[str, float] = field(default_factory=dict)
    frames: list[pd.DataFrame] = field(default_factory=list)
    claim_tables: list[pd.DataFrame] = field(default_factory=list)
    claim_prompts: list[pd.DataFrame] = field(default_factory=list)
    search: SearchRecord = field(default_factory=SearchRecord)

    @property
    def config(self) -> LocalizeConfig:
        return self.work.config

    def load_base(self) -> None:
        """``pre``, the examples on its tokenizer, and what the run found out in the manifest."""
        config, t0 = self.config, time.time()
        self.pre = load_member(config.role_specs()["pre"], "pre", self.settings, tokenizer=self.work.tokenizer)
        if config.estimates:  # partial grafts: the plan refused them before loading; a custom loader skips the plan
            refuse_estimates(self.pre.model)
        self.seconds["load"] = time.time() - t0
        self.examples, self.excluded = build_examples(self.work.prompts, self.pre.tokenizer)
        if self.excluded:
            self.say(f"{len(self.excluded)} prompt(s) excluded: {self.excluded[:3]}")
        templates = dict.fromkeys(e.prompt.template for e in self.examples)
        self.folder.update(
            LocalizeManifest, directions=self.work.choice.directions, directions_note=self.work.choice.note,
            excluded=self.excluded, n_prompts={t: sum(e.prompt.template == t for e in self.examples) for t in templates},
            prompt_directions=sorted({str(e.prompt.direction) for e in self.examples}),
            sft_models=[label for label, _ in config.sft_models()], null_models=self.nulls,
            search_model=config.mapped_models()[0][0] if config.search.enabled else None,
            models={"pre": _model_info(config.models["pre"], self.pre)})  # type: ignore[arg-type]
        if config.metric == "logit_diff":
            self.examples = _with_distractors(self.examples)

    @property
    def nulls(self) -> list[str]:
        return [label for label, _ in self.config.null_models() + self.config.control_models()]

    def map_model(self, i: int, label: str, spec: str) -> None:
        """The i-th mapped model (SFT, null or control; one in memory at a time): its cells in every
        direction, its claims, and for the first its found sets."""
        config, t0, sfts = self.config, time.time(), self.config.mapped_models()
        sft = _load_sft(spec, label, i == 0, pre=self.pre, adapter=self.work.adapters[i], settings=self.settings,
                        tokenizer=self.work.tokenizer, folder=self.folder)
        self.seconds["load"] += time.time() - t0
        found = self.folder.read(LocalizeManifest)
        self.folder.update(LocalizeManifest, models={**(found.models if found else {}), label: _model_info(spec, sft)})
        if len(sfts) > 1:
            self.say(f"[{label}] {spec}")
        pairs = {"sufficiency": [self.pre.model, sft.model], "necessity": [sft.model, self.pre.model]}
        run_dir = self.folder.path
        parts = run_dir / "parts" if i == 0 else run_dir / "parts" / _parts_name(i, len(sfts) - len(self.nulls), label)
        parts.mkdir(parents=True, exist_ok=True)
        stamp = "" if i == 0 else f"{label}/"
        cells = _model_maps(config, self.examples, self.pre.model, sft=sft.model, pairs=pairs, pad_id=self.pre.pad_id,
                            parts=parts, stamp=stamp, say=self.say, seconds=self.seconds)
        if config.claims.enabled:  # null finetunes too: no fact claim may hold on them
            t0 = time.time()
            setting = NULL_FINETUNE if label in self.nulls else PRE_SFT
            for direction in config.graft_directions:
                table, per_prompt = map_claims(pairs[direction], self.examples, cells, model_label=label, direction=direction,
                                               setting=setting, settings=config.claims, seed=config.seed, pad_id=self.pre.pad_id,
                                               metric=config.metric, chunk=config.exact_chunk, parts=parts, say=self.say)
                self.claim_tables.append(table)
                self.claim_prompts.append(per_prompt)
            self.seconds[f"{stamp}claims"] = time.time() - t0
        if i == 0:
            self.search = search_stage(config, self.folder, self.examples, cells=cells, pairs=pairs,
                                       model=self.pre.model, pad_id=self.pre.pad_id, label=(label, spec), say=self.say,
                                       seconds=self.seconds)
        cells.insert(0, "model", label)
        self.frames.append(cells)
        del sft, pairs, cells
        gc.collect()

    def reversal(self) -> None:
        """Claims 4-5 in the paper's own setting (``reversal:``), on the run's loader."""
        if not (self.work.reversal and self.config.claims.enabled):
            return
        t0 = time.time()
        table, per_prompt = reversal_claims(self.config, self.work.reversal, lambda spec, _dtype: load_role(spec, self.settings),
                                            dtype=self.settings.dtype, pad_id=self.pre.pad_id,
                                            parts=self.folder.path / "parts", say=self.say, pre=self.pre.model)
        self.claim_tables.append(table)
        self.claim_prompts.append(per_prompt)
        self.seconds["claims_reversal"] = time.time() - t0

    def tables(self) -> pd.DataFrame:
        """``cells.parquet``, the stability tables, ``claims.csv`` (and the claims by step)."""
        run_dir, config = self.folder.path, self.config
        cells = pd.concat(self.frames, ignore_index=True)
        _write(cells, run_dir / "cells.parquet")
        stability_stage(self.folder, whole_cells(cells), self.nulls)
        judged = write_claims(run_dir, self.claim_tables, self.claim_prompts, seed=config.seed,
                              control=CONTROL if config.control_models() else None, n_resamples=config.claims.resamples)
        if judged is not None:
            for (label, template, direction), rows in judged.groupby(["model", "template", "direction"], sort=False):
                self.say(f"[{label}/{direction}/{template}] claims: " + ", ".join(
                    f"{r['claim']} {r['verdict']}" for _, r in rows.iterrows() if r["null_kind"] != "none"))
            _claims_by_step(config, judged, run_dir, self.say)
        return cells


def run_localize(config: LocalizeConfig, progress: bool = True, load: Loader | None = None) -> LocalizeResult:
    """Run (or resume) a localize config: preflight -> claim -> stages (the base, each mapped
    model's maps and claims, the reversal's claims) -> tables. The module docstring says what it
    writes (all but the report page: ``weightgraft.api.pipelines.localize`` runs this, then draws it).

    ``load(spec, settings)`` returns an object with ``model`` and ``tokenizer`` (default: each
    spec loads itself)."""
    work = _preflight(config, load)
    folder = RunFolder(work.config.run_dir())
    _claim(folder.path, work.config, work.prompts)
    torch.manual_seed(work.config.seed)
    say = print if progress else (lambda *a, **k: None)
    say(work.choice.note)
    if work.warning:
        say(f"warning: {work.warning}")
    run = _Localize(work, folder, LoadSettings.of(work.config, load), say)
    run.load_base()
    for i, (label, spec) in enumerate(work.config.mapped_models()):
        run.map_model(i, label, spec)
    run.reversal()
    cells = run.tables()
    return LocalizeResult(folder.path, cells, run.search, run.excluded, run.seconds, None, work.choice.note)
