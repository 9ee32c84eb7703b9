"""``localize``: cell maps (attribution estimates, exact effects) and minimal graft sets of a
model pair on a dataset (a dataset folder or a free-form JSONL, as ``run`` reads them),
written to a run directory (``out``, else ``runs/{name}``) and resumed from it.

Stages, each written when finished (a rerun skips what exists): ``parts/estimates_{direction}
.parquet``; ``parts/exact_{direction}_{n}.parquet`` per group of prompts (``exact_parts``: a
killed run, or a raised ``exact:``, computes only the prompts no part holds); ``cells.parquet``
(both joined); ``search.json`` (``found_sets``: search on fit prompts, refinement, controls,
missed-effects estimate, held-out shares); ``stability.csv``; ``parts/claims_*`` per SFT model
and direction, and ``claims.csv`` / ``claims_prompts.parquet`` (``claims.stage``: the claims as exact
region grafts against their null, on the SFT and the null models; with ``reversal:``, claims 4-5 in the paper's setting,
``claims.reversal``); ``report/`` (drawn by ``weightgraft.api.localize``, since ``report``
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

import gc
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from weightgraft import atomic
from weightgraft.data.prompts import DatasetError
from weightgraft.engine.architectures import Units
from weightgraft.configfile import ConfigError
from weightgraft.devices import device_problem
from weightgraft.localization.claims import NULL_FINETUNE, PRE_SFT
from weightgraft.localization.claims.evidence import claims_evidence
from weightgraft.localization.claims.stage import map_claims, write_claims
from weightgraft.localization.claims.steps import claims_along_steps, snapshot_steps
from weightgraft.errors import ResultsDirConflict
from weightgraft.resume.claim import changed_entries, extends
from weightgraft.localization.config import CONTROL, LocalizeConfig
from weightgraft.localization.examples import LocalizeExample, build_examples
from weightgraft.localization.prompts import localize_prompts
from weightgraft.localization.exact_parts import exact_stage
from weightgraft.localization.found_sets import find_sets
from weightgraft.localization.maps import blank_frame, estimate_frame, unit_picks, whole_cells
from weightgraft.localization.plan_input import plan_input
from weightgraft.localization.claims.reversal import reversal_claims
from weightgraft.models.donors import LoadSettings, load_role
from weightgraft.models.loaded import LoadedModel
from weightgraft.models.spec import PeftSpec, parse_spec
from weightgraft.schemes.labels import LABEL_VERSION
from weightgraft.engine.partial import PartialGraft
from weightgraft.localization.stability import null_summary, stability_table
from weightgraft.models.errors import PeftError
from weightgraft.models.spec import check_models, check_roles, parse_peft, refuse_random
from weightgraft.models.tokenization import check_same_tokenizer, config_tokenizer, give_tokenizer
from weightgraft.planning.localize import plan_localize_work, refuse_estimates
from weightgraft.planning.plan import UNREADABLE_CONFIG, check_plan


@dataclass
class LocalizeResult:
    run_dir: Path
    cells: pd.DataFrame
    search: dict[str, Any]
    excluded: list[dict[str, str]]
    seconds: dict[str, float]
    report: Path | None = None  # report/index.html, None with report: false
    directions_note: str = ""  # which prompt directions were mapped, and why


def _digests(prompts: list[Any]) -> dict[str, str]:
    """Per prompt (template/id), a digest of its content: rows of a changed prompt are never mixed in."""
    import dataclasses
    import hashlib

    return {f"{p.template}/{p.id}": hashlib.sha256(json.dumps(dataclasses.asdict(p), sort_keys=True, default=str)
                                                   .encode()).hexdigest()[:16] for p in prompts}


def _spec_list(config: dict[str, Any], role: str) -> list[str]:
    specs = (config.get("models") or {}).get(role)
    return [specs] if isinstance(specs, str) else list(specs or [])


def _claim(run_dir: Path, config: LocalizeConfig, prompts: list[Any]) -> None:
    """A run directory belongs to one config (``exact`` aside: raising it extends the run, and
    SFT models appended to the list extend it too); resuming with another, with the SFT list
    changed or shortened, or with prompts whose content changed, is refused."""
    manifest = run_dir / "manifest.json"
    identity, dumped, digests = config.identity(), config.model_dump(mode="json"), _digests(prompts)
    if not manifest.is_file():
        (run_dir / "parts").mkdir(parents=True, exist_ok=True)
        atomic.write_json(manifest, {"identity": identity, "config": dumped, "examples": digests, "labels": LABEL_VERSION})
        return
    old = json.loads(manifest.read_text())
    try:  # the identity of the stored config under today's rules (so 'exact' may differ)
        same = LocalizeConfig.model_validate(old.get("config", {})).identity() == identity
    except ValueError:
        same = old.get("identity") == identity
    if not same:
        raise ResultsDirConflict(f"{run_dir} holds a localize run of another config; choose another 'out' or 'name'")
    if old.get("labels", 1) != LABEL_VERSION:  # its cells are keyed by labels that name other tokens
        raise ResultsDirConflict(f"{run_dir} holds cells named by position labels of version {old.get('labels', 1)} "
                                 f"(a span's last token was the span's name); this version names them "
                                 f"'{{span}}_last' (labels {LABEL_VERSION}); choose another 'out' or delete the folder")
    for role, what in (("sft", "SFT"), ("nulls", "null")):
        if not extends(before := _spec_list(old.get("config", {}), role), _spec_list(dumped, role)):
            raise ResultsDirConflict(f"{run_dir} holds maps of the {what} models {before}; a config may append "
                                     f"{what} models to that list, not change or drop them; choose another 'out' "
                                     "or 'name'")
    known = old.get("examples", {})
    changed = changed_entries(known, digests)
    if changed:
        raise ResultsDirConflict(f"{run_dir} holds cells of {len(changed)} prompt(s) whose content has changed "
                                 f"({', '.join(changed[:3])}); choose another 'out' or delete the folder")
    old.update({"identity": identity, "config": dumped, "examples": {**known, **digests}, "labels": LABEL_VERSION})
    atomic.write_json(manifest, old)


def _note(run_dir: Path, **fields: Any) -> None:
    """Add what this run found out (direction choice, prompt counts) to the manifest."""
    manifest = run_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    data.update(fields)
    atomic.write_json(manifest, data, default=str)


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
              settings: LoadSettings, run_dir: Path) -> LoadedModel:
    """One donor: loaded by spec, or the LoRA adapter on ``pre`` (recorded in the manifest:
    ``adapters`` by label, and ``adapter`` for the first SFT model)."""
    if adapter is None:
        return load_role(spec, settings)
    sft = load_role(adapter, settings, loaded={"pre": pre})
    assert sft.adapter is not None
    manifest = run_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    info = sft.adapter.as_dict("pre")
    data.setdefault("adapters", {})[label] = info
    if first:
        data["adapter"] = info
    atomic.write_json(manifest, data)
    return sft


def _model_info(spec: str, model: LoadedModel) -> dict[str, Any]:
    """A model's manifest entry; a LoRA donor's also names its adapter and its base, each by source
    and hash (the adapter's other details are recorded under ``adapters``)."""
    entry: dict[str, Any] = {"spec": spec, "source": model.source, "weights_sha256": model.weights_sha256}
    return entry if model.adapter is None else {**entry, **model.adapter.identity()}


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


def plan_before_localize(config: LocalizeConfig, prompts: list[Any]) -> LocalizeConfig:
    """What ``localize`` does before loading: refuse random models (no tokenizer) and a plan
    that does not fit, in one line; return the config with the plan's batch size where the
    config does not fix one."""

    if config.tokenizer is None:  # the config's tokenizer serves models that have none
        refuse_random(config.role_specs(), "weightgraft localize")
    work = plan_input(config, prompts)
    try:
        plan = plan_localize_work(work, with_time=False)
    except UNREADABLE_CONFIG:  # the loader then says what is wrong in its own words
        return config
    check_plan(plan)
    return config if plan.batch_size == config.batch_size else config.model_copy(update={"batch_size": plan.batch_size})


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
        path = parts / f"estimates_{direction}.parquet"
        t0 = time.time()
        if not path.is_file() and graft is None:  # every cell's row, estimate NaN
            _write(blank_frame(pre, examples, direction), path)
            tell(f"[{direction}] no estimates (estimates: false): every cell's row, estimate NaN")
        elif not path.is_file() and graft is not None:
            pair = graft if direction == "sufficiency" else graft.swapped()
            _write(estimate_frame(pair, examples, direction, metric=config.metric, batch_size=config.batch_size, ig_steps=config.ig_steps,
                                  units=config.units, unit_rows=config.unit_rows), path)
            seconds[f"{stamp}estimates_{direction}"] = time.time() - t0
            tell(f"[{direction}] estimates of every cell: {time.time() - t0:.1f}s")
        estimates = pd.read_parquet(path)
        if "unit" not in estimates:  # written before units: whole cells
            estimates.insert(estimates.columns.get_loc("slot") + 1, "unit", -1)
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


def run_localize(config: LocalizeConfig, progress: bool = True, load: Any = None) -> LocalizeResult:
    """Run (or resume) a localize config; see the module docstring for what it writes (all but
    the report page: ``weightgraft.api.localize.localize`` runs this, then draws it).

    ``load(spec, dtype)`` returns an object with ``model`` and ``tokenizer`` (default:
    ``weightgraft.models.load_model``)."""
    chosen = localize_prompts(config)  # fail on data before any model loads
    prompts, reversal, choice = chosen.mapped, chosen.reversal, chosen.choice
    evidence = claims_evidence(config, prompts, len(reversal)) if config.claims.enabled else None
    if evidence is not None and evidence.problem:  # claims that cannot reach a verdict: said before any model loads
        raise ConfigError(evidence.problem)
    adapters = _check_peft(config)

    # before any model loads; a vocabulary too small for it is refused from the models' configs
    shared_tokenizer = config_tokenizer(config.tokenizer, config.role_specs() if load is None else None)
    if load is None:  # memory plan from the configs: batch size, or a one-line refusal
        if (problem := device_problem(config.device)) is not None:
            raise ConfigError(f"device={problem}")
        check_models(config.role_specs(), "models")
        config = plan_before_localize(config, prompts)
    run_dir = config.run_dir()
    _claim(run_dir, config, prompts)
    torch.manual_seed(config.seed)
    say = print if progress else (lambda *a, **k: None)
    say(choice.note)
    if evidence is not None and evidence.warning:
        say(f"warning: {evidence.warning}")
    seconds: dict[str, float] = {}
    t0 = time.time()
    dtype = getattr(torch, config.dtype)
    custom = load
    settings = LoadSettings(device=config.device, dtype=dtype,
                            loader=None if custom is None else (lambda text: custom(text, dtype)))

    def load(spec: str, dt: torch.dtype) -> LoadedModel:  # the reversal claims' models, as the run's
        return load_role(spec, settings)
    pre = load_role(config.role_specs()["pre"], settings)
    give_tokenizer(pre, shared_tokenizer, "pre")
    if config.estimates:  # partial grafts: the plan refused them before loading; a custom loader skips the plan
        refuse_estimates(pre.model)
    seconds["load"] = time.time() - t0
    examples, excluded = build_examples(prompts, pre.tokenizer)
    if excluded:
        say(f"{len(excluded)} prompt(s) excluded: {excluded[:3]}")
    sfts = config.mapped_models()
    nulls = [label for label, _ in config.null_models() + config.control_models()]
    _note(run_dir, directions=choice.directions, directions_note=choice.note, excluded=excluded,
          n_prompts={t: sum(e.prompt.template == t for e in examples) for t in dict.fromkeys(e.prompt.template for e in examples)},
          prompt_directions=sorted({str(e.prompt.direction) for e in examples}),
          sft_models=[label for label, _ in config.sft_models()], null_models=nulls,
          search_model=sfts[0][0] if config.search.enabled else None,
          models={"pre": _model_info(config.models["pre"], pre)})
    if config.metric == "logit_diff":
        examples = _with_distractors(examples)
    pad_id = pre.pad_id
    frames = []
    claim_tables: list[pd.DataFrame] = []
    claim_prompts: list[pd.DataFrame] = []
    search: dict[str, Any] = {}
    for i, (label, spec) in enumerate(sfts):  # one SFT (or null) model in memory at a time
        t0 = time.time()
        sft = _load_sft(spec, label, i == 0, pre=pre, adapter=adapters[i], settings=settings, run_dir=run_dir)
        give_tokenizer(sft, shared_tokenizer, label)
        check_same_tokenizer(pre.tokenizer, sft.tokenizer, f"model {label!r}")
        seconds["load"] += time.time() - t0
        manifest = json.loads((run_dir / "manifest.json").read_text())
        _note(run_dir, models={**manifest.get("models", {}), label: _model_info(spec, sft)})
        if len(sfts) > 1:
            say(f"[{label}] {spec}")
        pairs = {"sufficiency": [pre.model, sft.model], "necessity": [sft.model, pre.model]}
        parts = run_dir / "parts" if i == 0 else run_dir / "parts" / _parts_name(i, len(sfts) - len(nulls), label)
        parts.mkdir(parents=True, exist_ok=True)
        stamp = "" if i == 0 else f"{label}/"
        cells = _model_maps(config, examples, pre.model, sft=sft.model, pairs=pairs, pad_id=pad_id, parts=parts, stamp=stamp, say=say, seconds=seconds)
        if config.claims.enabled:  # null finetunes too: no fact claim may hold on them
            t0 = time.time()
            setting = NULL_FINETUNE if label in nulls else PRE_SFT
            for direction in config.graft_directions:
                table, per_prompt = map_claims(pairs[direction], examples, cells, model_label=label, direction=direction, setting=setting,
                                               settings=config.claims, seed=config.seed, pad_id=pad_id, metric=config.metric, chunk=config.exact_chunk,
                                               parts=parts, say=say)
                claim_tables.append(table)
                claim_prompts.append(per_prompt)
            seconds[f"{stamp}claims"] = time.time() - t0
        if i == 0:
            search = find_sets(config, run_dir, examples, cells=cells, pairs=pairs, model=pre.model, pad_id=pad_id, say=say, seconds=seconds)
            if search:
                search["model"] = label
                atomic.write_json(run_dir / "search.json", search)
        cells.insert(0, "model", label)
        frames.append(cells)
        del sft, pairs, cells
        gc.collect()
    if reversal and config.claims.enabled:
        t0 = time.time()
        table, per_prompt = reversal_claims(config, reversal, load, dtype=dtype, pad_id=pad_id, parts=run_dir / "parts", say=say, pre=pre.model)
        claim_tables.append(table)
        claim_prompts.append(per_prompt)
        seconds["claims_reversal"] = time.time() - t0
    cells = pd.concat(frames, ignore_index=True)
    _write(cells, run_dir / "cells.parquet")

    table = stability_table(whole_cells(cells), nulls=nulls)
    atomic.write_text(run_dir / "stability.csv", table.to_csv(index=False))
    atomic.write_text(run_dir / "stability_null.csv", null_summary(table).to_csv(index=False))
    judged = write_claims(run_dir, claim_tables, claim_prompts, control=CONTROL if config.control_models() else None,
                          seed=config.seed, n_resamples=config.claims.resamples)
    if judged is not None:
        for (label, template, direction), rows in judged.groupby(["model", "template", "direction"], sort=False):
            say(f"[{label}/{direction}/{template}] claims: " + ", ".join(
                f"{r['claim']} {r['verdict']}" for _, r in rows.iterrows() if r["null_kind"] != "none"))
        _claims_by_step(config, judged, run_dir, say)
    return LocalizeResult(run_dir, cells, search, excluded, seconds, None, choice.note)
