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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.data.freeform import load_prompts
from weightgraft.data.prompts import DatasetError, load_test_prompts  # noqa: F401 (benchmarks import it here)
from weightgraft.configfile import json_digest
from weightgraft.experiments.config import ConfigError, ExperimentConfig
from weightgraft.experiments.continuations import sweep_continuations
from weightgraft.experiments.distributed import Ranks, start
from weightgraft.experiments.examples import (
    Exclusions,
    prepare,
    select_prompts,
    served_experts,
    served_slots,
)
from weightgraft.experiments.metrics import (
    add_recovery,
    summarize,
)
from weightgraft.experiments.pairs import paired_differences
from weightgraft.experiments.quantized_check import check_quantized_roles
from weightgraft.schemes.binding import compile_for
from weightgraft.experiments.scoring import baselines, compute_logits, score_rows
from weightgraft.schemes.selectors import (
    BUILTIN_POSITIONS,
    LITERAL_SPANS,
    position_names,
)
from weightgraft.experiments.store import ROWS_FORMAT, ResultsStore, write_atomic
from weightgraft.engine.forward import slots
from weightgraft.engine.architectures import model_slots, text_config
from weightgraft.engine.projections import hf_config
from weightgraft.engine.precision import batch_invariant_attention
from weightgraft.devices import device_problem
from weightgraft.experiments.batches import in_halves
from weightgraft.models import donors as model_donors
from weightgraft.models.donors import LeanSlots, LoadSettings, default_loader, load_role
from weightgraft.models.lean import memory_report
from weightgraft.models.spec import check_models, check_roles
from weightgraft.models.tokenization import check_same_tokenizer, config_tokenizer, give_tokenizer


@dataclass
class RunResult:
    run_dir: Path
    results: pd.DataFrame
    summary: pd.DataFrame
    exclusions: dict[str, Any]
    computed: int  # items computed by this invocation (0 when everything was already done)
    is_main: bool = True  # False on the other ranks of a multi-process run


def versions() -> dict[str, str]:
    """Python and the packages a run's numbers depend on, by version (recorded in manifests)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("weightgraft", "torch", "transformers", "safetensors", "pandas", "pyarrow"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def run_experiment(
    config: ExperimentConfig,
    load: Callable[[str, ExperimentConfig], Any] | None = None,
    progress: bool = True,
) -> RunResult:
    """Run (or resume) ``config``; returns the consolidated results and the summary.

    ``load(spec, config)`` returns an object with ``model``, ``tokenizer``, ``source`` and
    ``weights_sha256`` (default: ``weightgraft.models.load_model``).
    """
    from rich.progress import Progress

    started = time.time()
    schemes = config.resolved_schemes()
    scheme_meta = {s.name: {"family": s.family, "labels": json.dumps(s.labels, sort_keys=True)} for s in schemes}
    run_dir = Path(config.out or Path("runs") / config.name)
    _check_device(config.device)
    every_prompt = load_prompts(config.data)
    prompts = select_prompts(every_prompt, config)  # fail before claiming run_dir
    _check_names(config, schemes, prompts)
    for set_name, roles_spec in config.spec_sets().items():
        check_roles(roles_spec, f"model set {set_name!r}")
    every_role = {f"{name}/{role}": spec for name, roles in config.spec_sets().items() for role, spec in roles.items()}
    # before any model loads; a vocabulary too small for it is refused from the models' configs
    shared_tokenizer = config_tokenizer(config.tokenizer, every_role if load is None else None)
    if load is None:  # memory plan from the configs: batch size, or a one-line refusal
        from weightgraft.experiments.plan import plan_before_run

        for set_name, roles_spec in config.spec_sets().items():  # a missing model first, before the run dir
            check_models(roles_spec, f"model set {set_name!r}")

        config = plan_before_run(config, prompts)
    ranks = start(config.device)
    if ranks.world > 1:
        config = config.model_copy(update={"device": ranks.device(config.device)})
        progress = progress and ranks.is_main
    store = _open_store(run_dir, config, ranks, run_identity(config, schemes, prompts))
    done = store.done()
    # one cache for the run: SVD factors per (base, donor) pair for every k, the base of a LoRA
    # role whose base role no scheme uses
    chosen = load or default_loader
    settings = LoadSettings.of(config, None if chosen is model_donors.default_loader else chosen)
    exclusions = Exclusions()
    order: list[tuple] = []
    model_info: dict[str, dict[str, dict[str, Any]]] = {}
    computed = oom_splits = 0
    continuations: list[dict[str, Any]] = []
    for set_name, roles_spec in config.spec_sets().items():
        used = sorted(set().union(*(s.roles() for s in schemes)), key=list(roles_spec).index)
        first = load_role(roles_spec[used[0]], settings, roles=roles_spec)
        give_tokenizer(first, shared_tokenizer, used[0])
        store.add_model(set_name, used[0], first.weights_sha256)
        roles = {r: i for i, r in enumerate(used)}
        base = baselines(schemes, used[0])
        names = slots(first.model)
        compiled = compile_for(schemes, first.model, used, config.protocol)
        prepared = prepare(prompts, first.tokenizer, compiled, set_name, exclusions, world=every_prompt)
        served = served_slots(prepared, names)
        experts = served_experts(prepared, names, [s.name for s in model_slots(first.model) if s.experts])
        loaded = {used[0]: first}
        for role in used[1:]:
            loaded[role] = load_role(roles_spec[role], settings, roles=roles_spec, loaded=loaded,
                                     lean=LeanSlots(first, served.get(roles[role], set()), experts.get(roles[role], {})))
            give_tokenizer(loaded[role], shared_tokenizer, role)
            check_same_tokenizer(first.tokenizer, loaded[role].tokenizer, f"model {role!r}")
            store.add_model(set_name, role, loaded[role].weights_sha256)
        checked = check_quantized_roles(roles_spec, loaded, prepared, settings)  # a quantized finetune vs itself dense
        models = [loaded[r].model for r in used]
        batch_invariant_attention(models)
        memory = {r: memory_report(m, models[0]).as_dict() for r, m in zip(used, models)}
        model_info[set_name] = {
            r: {"spec": roles_spec[r].text, "source": lm.source, "weights_sha256": lm.weights_sha256,
                "n_layers": text_config(hf_config(first.model)).num_hidden_layers, **memory[r],
                **({"adapter": lm.adapter.as_dict(lora[0])}
                   if lm.adapter is not None and (lora := roles_spec[r].adapter) is not None else {}),
                **({"quantized_agreement": checked[r]} if r in checked else {})}
            for r, lm in loaded.items()
        }
        if progress:
            held = ", ".join(f"{r} {m['bytes_held'] / 2**20:.1f} MiB" for r, m in memory.items())
            print(f"[{set_name}] weights held: {held}")
        items = [(ex, s.name) for ex in prepared for s in schemes if s.name in ex.sources]
        order.extend((set_name, ex.prompt.template, s, ex.prompt.id) for ex, s in items)
        todo = [it for it in items if (set_name, it[0].prompt.template, it[1], it[0].prompt.id) not in done]
        pad_id = first.pad_id
        with Progress(disable=not progress, transient=False) as bar:
            task = bar.add_task(f"[{set_name}] grafting", total=len(items), completed=len(items) - len(todo))
            try:
                scored = functools.partial(_scored, models=models, pad_id=pad_id, config=config, base=base,
                                           tokenizer=first.tokenizer, set_name=set_name, scheme_meta=scheme_meta)
                for chunk in _my_batches(items, todo, config.batch_size, ranks):
                    parts, splits = in_halves(chunk, scored, functools.partial(_say_split, set_name))
                    for part in parts:
                        store.append(part)
                    oom_splits += splits
                    computed += len(chunk)
                    bar.advance(task, len(chunk) * ranks.world)
            except KeyboardInterrupt:
                print(f"interrupted: {len(store.done())} row(s) are saved in {run_dir}; "
                      "the same command resumes from them", file=sys.stderr)
                if ranks.is_main:
                    _note_interrupted(run_dir, started, computed)
                raise
        if config.generate is not None and ranks.is_main:
            g = config.generate
            continuations += sweep_continuations(models, first.tokenizer, prepared, compiled=compiled, n_examples=g.n_examples,
                                                 max_new_tokens=g.max_new_tokens, schemes=g.schemes, served=served, model_set=set_name)
        del models, loaded
    computed = ranks.total(computed)
    if not ranks.is_main:
        return _follow_main(run_dir, ranks, computed)
    try:
        return _finish(run_dir, config, schemes, store=store, order=order, exclusions=exclusions, model_info=model_info,
                       computed=computed, started=started, ranks=ranks, continuations=continuations, oom_splits=oom_splits)
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


def _check_device(device: str) -> None:
    """A device that is not here (``device=cuda`` without CUDA): one line, before loading."""
    problem = device_problem(device)
    if problem is not None:
        raise ConfigError(f"device={problem}")


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


def run_identity(config: ExperimentConfig, schemes: list[Any], prompts: list[Any]) -> dict[str, Any]:
    """What the rows depend on: the core settings, each scheme's definition and each test
    prompt's content (model weights are added as they load)."""
    digest = json_digest

    return {
        "rows_format": ROWS_FORMAT,
        "core": config.identity_core(),
        "schemes": {s.name: digest(s.model_dump(mode="json")) for s in schemes},
        "examples": {p.id: digest(dataclasses.asdict(p)) for p in prompts},
        "models": {},
    }


def _open_store(run_dir: Path, config: ExperimentConfig, ranks: Ranks, identity: dict[str, Any]) -> ResultsStore:
    """The main rank checks the directory first; the others then join it, each writing its
    own parts."""
    dumped = config.model_dump(mode="json")
    if ranks.world == 1:
        return ResultsStore(run_dir, identity, dumped)
    writer = f"r{ranks.rank}"
    store, error = None, None
    if ranks.is_main:
        try:
            store = ResultsStore(run_dir, identity, dumped, writer)
        except Exception as exc:  # noqa: BLE001 - any error: tell the other ranks, then raise it
            error = exc
    failed = ranks.total(int(error is not None))
    if failed:
        ranks.close()
        raise error or RuntimeError(f"rank 0 could not open the results directory {run_dir}; see its error")
    return store or ResultsStore(run_dir, identity, dumped, writer)


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
    if not merged.is_file():
        raise RuntimeError(f"rank 0 did not write {merged}; see its error")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return RunResult(run_dir, pd.read_parquet(merged), pd.read_csv(run_dir / "summary.csv"),
                     manifest["exclusions"], computed, is_main=False)


_INTERRUPTED = "sessions_interrupted.jsonl"  # sessions stopped before a manifest was written


def _note_interrupted(run_dir: Path, started: float, computed: int) -> None:
    """A stopped session's timing, for the manifest the next finished session writes."""
    session = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_seconds": round(time.time() - started, 2),
               "computed_this_run": computed, "interrupted": True}
    with (run_dir / _INTERRUPTED).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(session) + "\n")


def _finish(run_dir, config, schemes, *, store, order, exclusions, model_info, computed, started, ranks, continuations=(),
            oom_splits=0) -> RunResult:
    """Merge the parts into ``results.parquet``, then the summary, exclusions and manifest."""
    exclusion_summary = exclusions.summary()
    run_dir.mkdir(parents=True, exist_ok=True)
    columns = ["model_set", "template", "example_id", "reason"]
    write_atomic(run_dir / "exclusions.csv",
                 pd.DataFrame(exclusion_summary["examples"], columns=columns).to_csv(index=False).encode())
    results = store.consolidate(order)
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
    if continuations:
        write_atomic(run_dir / "continuations.csv", pd.DataFrame(list(continuations)).to_csv(index=False).encode())
    manifest = {
        "name": config.name, "identity": config.identity(), "protocol": config.protocol,
        "config": config.model_dump(mode="json"),
        "schemes": [s.model_dump(mode="json") for s in schemes], "versions": versions(),
        "models": model_info, "model_set_steps": config.set_steps(), "device": config.device, "dtype": config.dtype, "seed": config.seed,
        "exclusions": exclusion_summary, "n_rows": len(results),
        "n_partial_target": int(results["target_partial"].sum()) if "target_partial" in results else 0, "computed_this_run": computed,
        "n_weak_first_token": int(results["weak_first_token"].sum()) if "weak_first_token" in results else 0,
        "processes": ranks.world, "batches_split_on_oom": oom_splits,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_seconds": round(time.time() - started, 2),
    }
    # every invocation's timing, oldest first (a rerun adds its own, it never overwrites)
    earlier = []
    if (run_dir / "manifest.json").is_file():
        try:
            earlier = json.loads((run_dir / "manifest.json").read_text()).get("sessions", [])
        except (ValueError, OSError):
            earlier = []
    stopped = run_dir / _INTERRUPTED
    if stopped.is_file():
        earlier += [json.loads(line) for line in stopped.read_text(encoding="utf-8").splitlines() if line.strip()]
    manifest["sessions"] = [*earlier, {k: manifest[k] for k in ("started", "finished", "wall_seconds", "computed_this_run")}]
    write_atomic(run_dir / "manifest.json", json.dumps(manifest, indent=2, default=str).encode())
    stopped.unlink(missing_ok=True)
    return RunResult(run_dir, results, summary, exclusion_summary, computed)


