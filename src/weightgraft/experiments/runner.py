"""Run an experiment: test prompts x schemes x model sets -> results store -> summary.

Data flows one way: config -> compiled schemes -> per-example source tensors -> batched
``prefix_forward`` (one-pass ``graft_forward`` calls) -> metrics rows -> store -> summary (-> report).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.configfile import json_digest
from weightgraft.data.freeform import load_prompts
from weightgraft.data.prompts import DatasetError, TestPrompt, load_test_prompts  # noqa: F401 (benchmarks import it here)
from weightgraft.engine.architectures import model_slots, text_config
from weightgraft.engine.forward import slots
from weightgraft.engine.precision import batch_invariant_attention
from weightgraft.engine.projections import hf_config
from weightgraft.experiments import plan as sweep_plan
from weightgraft.experiments.batches import in_halves
from weightgraft.experiments.config import ConfigError, ExperimentConfig
from weightgraft.experiments.continuations import ContinuationRow, sweep_continuations
from weightgraft.experiments.distributed import Ranks, start
from weightgraft.experiments.examples import Exclusions, prepare, select_prompts, served_experts, served_slots
from weightgraft.experiments.metrics import add_recovery, summarize
from weightgraft.experiments.pairs import paired_differences
from weightgraft.experiments.quantized_check import check_quantized_roles
from weightgraft.experiments.scoring import baselines, compute_logits, score_rows
from weightgraft.experiments.store import ROWS_FORMAT, ResultsStore, write_atomic
from weightgraft.models import donors as model_donors
from weightgraft.models.donors import LeanSlots, LoadSettings, default_loader, load_member
from weightgraft.models.lean import memory_report
from weightgraft.models.loaded import LoadedModel, Loader
from weightgraft.models.spec import ModelSpec
from weightgraft.planning.preflight import preflight
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import Json, Session, SweepClaim, SweepManifest
from weightgraft.schemes.binding import compile_for
from weightgraft.schemes.scheme import Scheme
from weightgraft.schemes.selectors import BUILTIN_POSITIONS, LITERAL_SPANS, position_names


@dataclass
class RunResult:
    run_dir: Path
    results: pd.DataFrame
    summary: pd.DataFrame
    exclusions: Json  # the manifest's: counts by reason, the examples left out, the schemes skipped
    computed: int  # items computed by this invocation (0 when everything was already done)
    is_main: bool = True  # False on the other ranks of a multi-process run
    report: Path | None = None  # report/index.html (written by the front door), None with report: false


def versions() -> dict[str, str]:
    """Python and the packages a run's numbers depend on, by version (recorded in manifests). The
    hybrids' mixer kernels among them: where one is installed (on a GPU), transformers runs it in
    place of its torch fallback, so the record says which path a hybrid's numbers came from."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("weightgraft", "torch", "transformers", "safetensors", "pandas", "pyarrow",
                 "flash-linear-attention", "causal-conv1d", "mamba-ssm"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


@dataclass
class _Work:
    """What a sweep knows before a model loads: the config it runs (with the plan's batch size
    and this process's device), its schemes, its prompts (and the dataset's, whose other answers
    some metrics read), the config's tokenizer, the processes."""

    config: ExperimentConfig
    schemes: list[Scheme]
    prompts: list[TestPrompt]
    world: list[TestPrompt]
    tokenizer: Any
    ranks: Ranks


def _preflight(config: ExperimentConfig, load: Loader | None) -> _Work:
    """Everything refused before a model loads or the folder is claimed: the data, position
    names and roles no scheme uses, then the one pre-load check (device, models, the plan)."""
    schemes = config.resolved_schemes()
    every_prompt = load_prompts(config.data)
    prompts = select_prompts(every_prompt, config)
    _check_names(config, schemes, prompts)
    sets = config.spec_sets()
    checked = preflight(config, {f"model set {name!r}": roles for name, roles in sets.items()},
                        {f"{name}/{role}": spec for name, roles in sets.items() for role, spec in roles.items()},
                        plan=lambda: sweep_plan.plan_experiment(config, prompts, with_time=False),
                        command="weightgraft run", batch_size=config.batch_size,
                        custom_loader=load is not None)
    ranks = start(config.device)
    update: dict[str, Any] = {"batch_size": checked.batch_size} if checked.batch_size != config.batch_size else {}
    if ranks.world > 1:
        update["device"] = ranks.device(config.device)
    return _Work(config.model_copy(update=update) if update else config, schemes, prompts, every_prompt,
                 checked.tokenizer, ranks)


@dataclass
class _Sweep:
    """A sweep in its claimed folder: what every model set adds (rows, models, continuations)."""

    work: _Work
    store: ResultsStore
    settings: LoadSettings
    progress: bool
    started: float
    done: set[tuple] = field(default_factory=set)
    exclusions: Exclusions = field(default_factory=Exclusions)
    order: list[tuple] = field(default_factory=list)
    model_info: dict[str, dict[str, Json]] = field(default_factory=dict)  # model set -> role -> manifest entry
    continuations: list[ContinuationRow] = field(default_factory=list)
    computed: int = 0
    oom_splits: int = 0

    def model_set(self, set_name: str, roles_spec: dict[str, ModelSpec]) -> None:
        """One model set: its models loaded (donors holding only what the schemes graft), its
        rows computed batch by batch into the store, its continuations."""
        config, schemes, store = self.work.config, self.work.schemes, self.store
        used = sorted(set().union(*(s.roles() for s in schemes)), key=list(roles_spec).index)
        first = load_member(roles_spec[used[0]], used[0], self.settings, tokenizer=self.work.tokenizer, roles=roles_spec)
        store.add_model(set_name, used[0], first.weights_sha256)
        names = slots(first.model)
        compiled = compile_for(schemes, first.model, used, config.protocol)
        prepared = prepare(self.work.prompts, first.tokenizer, compiled, set_name, self.exclusions, world=self.work.world)
        served = served_slots(prepared, names)
        experts = served_experts(prepared, names, [s.name for s in model_slots(first.model) if s.experts])
        loaded = {used[0]: first}
        for i, role in enumerate(used[1:], 1):
            loaded[role] = load_member(roles_spec[role], role, self.settings, tokenizer=self.work.tokenizer, base=first,
                                       roles=roles_spec, loaded=loaded,
                                       lean=LeanSlots(first, served.get(i, set()), experts.get(i, {})))
            store.add_model(set_name, role, loaded[role].weights_sha256)
        checked = check_quantized_roles(roles_spec, loaded, prepared, self.settings)  # a quantized finetune vs itself dense
        models = [loaded[r].model for r in used]
        batch_invariant_attention(models)
        self.model_info[set_name] = _model_info(roles_spec, loaded, models, checked)
        if self.progress:
            held = ", ".join(f"{r} {m['bytes_held'] / 2**20:.1f} MiB" for r, m in self.model_info[set_name].items())
            print(f"[{set_name}] weights held: {held}")
        self._rows(set_name, prepared, models, first, baselines(schemes, used[0]))
        if config.generate is not None and self.work.ranks.is_main:
            g = config.generate
            self.continuations += sweep_continuations(models, first.tokenizer, prepared, compiled=compiled,
                                                      n_examples=g.n_examples, max_new_tokens=g.max_new_tokens,
                                                      schemes=g.schemes, served=served, model_set=set_name)

    def _rows(self, set_name: str, prepared: list[Any], models: list[Any], first: LoadedModel, base: Any) -> None:
        """The set's (example, scheme) rows no part holds, in batches (halved on out-of-memory)."""
        from rich.progress import Progress

        config, ranks, schemes = self.work.config, self.work.ranks, self.work.schemes
        scheme_meta = {s.name: {"family": s.family, "labels": json.dumps(s.labels, sort_keys=True)} for s in schemes}
        items = [(ex, s.name) for ex in prepared for s in schemes if s.name in ex.sources]
        self.order.extend((set_name, ex.prompt.template, s, ex.prompt.id) for ex, s in items)
        todo = [it for it in items if (set_name, it[0].prompt.template, it[1], it[0].prompt.id) not in self.done]
        scored = functools.partial(_scored, models=models, pad_id=first.pad_id, config=config, base=base,
                                   tokenizer=first.tokenizer, set_name=set_name, scheme_meta=scheme_meta)
        with Progress(disable=not self.progress, transient=False) as bar:
            task = bar.add_task(f"[{set_name}] grafting", total=len(items), completed=len(items) - len(todo))
            try:
                for chunk in _my_batches(items, todo, config.batch_size, ranks):
                    parts, splits = in_halves(chunk, scored, functools.partial(_say_split, set_name))
                    for part in parts:
                        self.store.append(part)
                    self.oom_splits += splits
                    self.computed += len(chunk)
                    bar.advance(task, len(chunk) * ranks.world)
            except KeyboardInterrupt:
                print(f"interrupted: {len(self.store.done())} row(s) are saved in {self.store.run_dir}; "
                      "the same command resumes from them", file=sys.stderr)
                if ranks.is_main:
                    _note_interrupted(self.store.run_dir, self.started, self.computed)
                raise


def _model_info(roles_spec: dict[str, ModelSpec], loaded: dict[str, LoadedModel], models: list[Any],
                checked: dict[str, Json]) -> dict[str, Json]:
    """Each role's manifest entry: spec, source, hash, depth, memory held, adapter, quantized check."""
    first = next(iter(loaded.values()))
    out = {}
    for (r, lm), model in zip(loaded.items(), models):
        lora = roles_spec[r].adapter
        out[r] = {"spec": roles_spec[r].text, "source": lm.source, "weights_sha256": lm.weights_sha256,
                  "n_layers": text_config(hf_config(first.model)).num_hidden_layers, **memory_report(model, models[0]).as_dict(),
                  **({"adapter": lm.adapter.as_dict(lora[0])} if lm.adapter is not None and lora is not None else {}),
                  **({"quantized_agreement": checked[r]} if r in checked else {})}
    return out


def run_experiment(config: ExperimentConfig, load: Loader | None = None, progress: bool = True) -> RunResult:
    """Run (or resume) ``config``: preflight -> claim -> each model set's rows -> results and
    manifest; returns the consolidated results and the summary (the report is the front door's:
    ``weightgraft.api.run``).

    ``load(spec, settings)`` returns an object with ``model``, ``tokenizer``, ``source`` and
    ``weights_sha256`` (default: each spec loads itself)."""
    started = time.time()
    work = _preflight(config, load)
    config, ranks = work.config, work.ranks
    progress = progress and ranks.is_main
    store = _open_store(config.run_dir(), config, ranks, run_identity(config, work.schemes, work.prompts))
    chosen = load or default_loader  # one cache for the run: SVD factors, a LoRA role's unused base
    settings = LoadSettings.of(config, None if chosen is model_donors.default_loader else chosen)
    sweep = _Sweep(work, store, settings, progress, started, store.done())
    for set_name, roles_spec in config.spec_sets().items():
        sweep.model_set(set_name, roles_spec)
    computed = ranks.total(sweep.computed)
    if not ranks.is_main:
        return _follow_main(store.run_dir, ranks, computed)
    try:
        return _finish(store.run_dir, sweep, computed)
    finally:
        ranks.barrier()  # the other ranks read what the main rank merged
        ranks.close()


def _scored(rows: Sequence[Any], *, models: list[Any], pad_id: int, config: ExperimentConfig, base: Any,
            tokenizer: Any, set_name: str, scheme_meta: Any) -> Any:
    """The scored rows of one batch of (example, scheme) items."""
    logits, n_logits, donors = compute_logits(models, rows, pad_id, config.score_answer, config.prefix_sharing, base)
    return score_rows(rows, logits, n_logits, tokenizer, set_name, scheme_meta, donors, base)


def _say_split(set_name: str, line: str) -> None:
    print(f"[{set_name}] {line}", file=sys.stderr)


def _check_names(config: ExperimentConfig, schemes: list[Any], prompts: list[Any]) -> None:
    """Position names the dataset does not mark and model roles no scheme uses: refused up
    front (a typo would otherwise exclude every example, or load a model for nothing)."""
    marked = set().union(*(p.spans for p in prompts))
    known = BUILTIN_POSITIONS | LITERAL_SPANS | marked
    for s in schemes:
        for k, rule in enumerate(s.rules):
            unknown = sorted(position_names(rule.positions) - known)
            if unknown:
                raise ConfigError(
                    f"scheme {s.name!r}, rule {k}: position name(s) {unknown} are neither built in "
                    f"({', '.join(sorted(BUILTIN_POSITIONS))}) nor spans of the dataset (it marks "
                    f"{', '.join(sorted(marked)) or 'none'})"
                )
    used = set().union(*(s.roles() for s in schemes))
    for set_name, roles in config.spec_sets().items():
        referenced = {ref for r, spec in roles.items() if r in used for ref in spec.refs()}
        extra = sorted(set(roles) - used - referenced)
        if extra:
            raise ConfigError(
                f"model role(s) {extra} of model set {set_name!r} are used by no scheme (the schemes "
                f"use {sorted(used)}); remove them or fix the role name"
            )


def run_identity(config: ExperimentConfig, schemes: list[Scheme], prompts: list[TestPrompt]) -> SweepClaim:
    """What the rows depend on: the core settings, each scheme's definition and each test
    prompt's content (model weights are added as they load), and the config that asks for them."""
    return SweepClaim(rows_format=ROWS_FORMAT, core=config.identity_core(),
                      schemes={s.name: json_digest(s.model_dump(mode="json")) for s in schemes},
                      examples={p.id: json_digest(dataclasses.asdict(p)) for p in prompts}, models={},
                      config=config.model_dump(mode="json"))


def _open_store(run_dir: Path, config: ExperimentConfig, ranks: Ranks, identity: SweepClaim) -> ResultsStore:
    """The main rank checks the directory first; the others then join it, each writing its
    own parts."""
    if ranks.world == 1:
        return ResultsStore(run_dir, identity)
    writer = f"r{ranks.rank}"
    store, error = None, None
    if ranks.is_main:
        try:
            store = ResultsStore(run_dir, identity, writer)
        except Exception as exc:  # noqa: BLE001 - any error: tell the other ranks, then raise it
            error = exc
    failed = ranks.total(int(error is not None))
    if failed:
        ranks.close()
        raise error or RuntimeError(f"rank 0 could not open the results directory {run_dir}; see its error")
    return store or ResultsStore(run_dir, identity, writer)


def _my_batches(items: list, todo: list, batch_size: int, ranks: Ranks) -> list[list]:
    """This rank's batches. One process packs what is left to do; several deal out the
    sweep's batches whole, in order, so each row is computed as one process would."""
    if ranks.world == 1:
        return [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
    left = {id(it) for it in todo}
    out = []
    for j, i in enumerate(range(0, len(items), batch_size)):
        chunk = [it for it in items[i : i + batch_size] if id(it) in left]
        if ranks.mine(j) and chunk:
            out.append(chunk)
    return out


def _follow_main(run_dir: Path, ranks: Ranks, computed: int) -> RunResult:
    """A non-main rank: wait until the main rank has merged, then read what it wrote."""
    ranks.barrier()
    ranks.close()
    merged = run_dir / "results.parquet"
    manifest = RunFolder(run_dir).read(SweepManifest)
    if not merged.is_file() or manifest is None:
        raise RuntimeError(f"rank 0 did not write {merged}; see its error")
    return RunResult(run_dir, pd.read_parquet(merged), pd.read_csv(run_dir / "summary.csv"),
                     manifest.exclusions, computed, is_main=False)


_INTERRUPTED = "sessions_interrupted.jsonl"  # sessions stopped before a manifest was written


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def _note_interrupted(run_dir: Path, started: float, computed: int) -> None:
    """A stopped session's timing, for the manifest the next finished session writes."""
    session = Session(started=_stamp(started), finished=_stamp(time.time()), wall_seconds=round(time.time() - started, 2),
                      computed_this_run=computed, interrupted=True)
    with (run_dir / _INTERRUPTED).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(session.as_json()) + "\n")


def _sessions(folder: RunFolder, this: Session) -> list[Session]:
    """Every invocation's timing, oldest first: the last manifest's, the stopped ones', this one."""
    try:
        found = folder.read(SweepManifest)
    except (ValueError, OSError):
        found = None
    earlier = list(found.sessions) if found is not None else []
    stopped = folder.path / _INTERRUPTED
    if stopped.is_file():
        earlier += [Session.model_validate_json(line) for line in stopped.read_text(encoding="utf-8").splitlines()
                    if line.strip()]
    return [*earlier, this]


def _tables(run_dir: Path, sweep: _Sweep) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``exclusions.csv``, ``results.parquet`` (the parts merged, with recovery), ``summary.csv``,
    and with their settings ``summary_pairs.csv`` and ``continuations.csv``."""
    config, exclusion_summary = sweep.work.config, sweep.exclusions.summary()
    run_dir.mkdir(parents=True, exist_ok=True)
    columns = ["model_set", "template", "example_id", "reason"]
    write_atomic(run_dir / "exclusions.csv",
                 pd.DataFrame(exclusion_summary["examples"], columns=columns).to_csv(index=False).encode())
    results = sweep.store.consolidate(sweep.order)
    if results.empty:
        raise DatasetError(
            f"every example was excluded, nothing to summarize: {exclusion_summary['by_reason']} "
            f"(details in {run_dir / 'exclusions.csv'})"
        )
    results = add_recovery(results)  # per example, from the stored baseline rows
    write_atomic(run_dir / "results.parquet", results.to_parquet(index=False))
    summary = summarize(results)
    write_atomic(run_dir / "summary.csv", summary.to_csv(index=False).encode())
    if config.pairs:
        pairs = paired_differences(results, config.pairs)
        write_atomic(run_dir / "summary_pairs.csv", pairs.to_csv(index=False).encode())
    if sweep.continuations:
        write_atomic(run_dir / "continuations.csv", pd.DataFrame(list(sweep.continuations)).to_csv(index=False).encode())
    return results, summary


def _finish(run_dir: Path, sweep: _Sweep, computed: int) -> RunResult:
    """The tables, then the manifest (this session's timing added to the earlier ones')."""
    results, summary = _tables(run_dir, sweep)
    config, folder, exclusion_summary = sweep.work.config, RunFolder(run_dir), sweep.exclusions.summary()
    finished = time.time()
    this = Session(started=_stamp(sweep.started), finished=_stamp(finished),
                   wall_seconds=round(finished - sweep.started, 2), computed_this_run=computed)
    manifest = SweepManifest(
        name=config.name, identity=config.identity(), protocol=config.protocol, config=config.model_dump(mode="json"),
        schemes=[s.model_dump(mode="json") for s in sweep.work.schemes], versions=versions(),
        models=sweep.model_info, model_set_steps=config.set_steps(), device=config.device, dtype=config.dtype,  # type: ignore[arg-type]
        seed=config.seed, exclusions=exclusion_summary, n_rows=len(results),
        n_partial_target=int(results["target_partial"].sum()) if "target_partial" in results else 0,
        computed_this_run=computed,
        n_weak_first_token=int(results["weak_first_token"].sum()) if "weak_first_token" in results else 0,
        processes=sweep.work.ranks.world, batches_split_on_oom=sweep.oom_splits, started=this.started,
        finished=this.finished, wall_seconds=this.wall_seconds, sessions=_sessions(folder, this))
    folder.write(manifest)
    (run_dir / _INTERRUPTED).unlink(missing_ok=True)
    return RunResult(run_dir, results, summary, exclusion_summary, computed)
