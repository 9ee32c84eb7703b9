"""The plan of a ``run`` config, before any weight is read, and the check ``run`` makes with it.

Why: a sweep on a 2B or 8B model that cannot fit should be refused in one line, saying what
would make it fit (or that nothing in the config would), not die an hour in; and a user should
know how long it will take. This module reads the config (model sets, schemes, prompts) into
the shapes ``weightgraft.planning`` computes with: each role's ``config.json`` built on the
meta device, the prompts tokenized (or estimated) and the schemes compiled into source maps.
"""

from __future__ import annotations

import math
from dataclasses import replace

from weightgraft.data.prompts import TestPrompt
from weightgraft.experiments.config import ConfigError, ExperimentConfig
from weightgraft.models.footprint import ModelFootprint
from weightgraft.models.spec import ModelSpec
from weightgraft.planning.graftable import check_graftable
from weightgraft.planning.budget import budget, cuda_here
from weightgraft.planning.cards import Card
from weightgraft.planning.lengths import length_summary, tokenizer_for
from weightgraft.planning.plan import HEADROOM, Plan, RolePlan, choose_batch, with_planned_batch
from weightgraft.planning.run import RoleShape, RunSettings, SetShape, held, quantized_notes, run_advice
from weightgraft.planning.timing import card_for, forward_seconds, rate_for, weight_read_seconds

__all__ = ["DEFAULT_RUN_BATCH", "plan_before_run", "plan_experiment"]

DEFAULT_RUN_BATCH = 64  # ExperimentConfig.batch_size's default: the most a plan chooses


def _role_footprint(spec: ModelSpec, roles_spec: dict[str, ModelSpec], cache: dict[str, ModelFootprint]) -> ModelFootprint:
    """The footprint of a role's shapes: a low-rank role has its donor's, a LoRA role its base's."""
    while (shaped := spec.shape_role()) is not None:
        spec = roles_spec[shaped]
    if spec.text not in cache:
        cache[spec.text] = spec.footprint()
    return cache[spec.text]


def _set_shapes(config: ExperimentConfig, prompts: list[TestPrompt]) -> tuple[list[SetShape], dict]:
    """Per model set: its roles' footprints, the (tokens, logits) of every (example, scheme)
    row and the bytes of the source maps; and the prompts' lengths."""
    from weightgraft.experiments.examples import Exclusions, prepare, served_slots
    from weightgraft.schemes.binding import compile_for

    schemes = config.resolved_schemes()
    footprints: dict[str, ModelFootprint] = {}
    shapes, lengths = [], {}
    for set_name, roles_spec in config.spec_sets().items():
        used = sorted(set().union(*(s.roles() for s in schemes)), key=list(roles_spec).index)
        base = _role_footprint(roles_spec[used[0]], roles_spec, footprints)
        names = base.slot_names
        compiled = compile_for(schemes, base.meta, used, config.protocol)
        tok, how = tokenizer_for(base, config.tokenizer)
        prepared = prepare(prompts, tok, compiled, set_name, Exclusions())
        if not prepared:
            raise ConfigError(f"model set {set_name!r}: every example is excluded (spans not found); nothing to plan")
        served = served_slots(prepared, names)
        rows, source_bytes = [], 0
        for ex in prepared:
            extra = len(ex.answer_ids) - 1 if config.score_answer else 0
            for s in schemes:
                if s.name in ex.sources:
                    rows.append((len(ex.input_ids) + extra, 1 + extra))
                    source_bytes += ex.sources[s.name].numel() * 8
            source_bytes += sum(h.numel() * 8 for maps in ex.heads.values() for h in maps.values())
        lengths = length_summary([len(ex.input_ids) for ex in prepared], how)
        roles = [RoleShape(role=role, spec=roles_spec[role], footprint=_role_footprint(roles_spec[role], roles_spec, footprints),
                           served=served.get(i, set()) if i else None)
                 for i, role in enumerate(used)]
        for r in roles[1:]:
            check_graftable(used[0], base, r.role, r.footprint)
        shapes.append(SetShape(name=set_name, base=base, roles=roles, rows=rows, source_bytes=source_bytes))
    return shapes, lengths


def _spread(config: ExperimentConfig, memory: str | None, gpu: Card | None) -> tuple[int, int] | None:
    """(GPUs, their memory in all) of this machine where a ``device_map`` could spread the run."""
    if memory or gpu is not None or not config.device.startswith("cuda") or not cuda_here():
        return None
    import torch

    n = torch.cuda.device_count()
    return (n, budget(config.device, all_gpus=True).limit) if n > 1 else None


def plan_experiment(config: ExperimentConfig, prompts: list[TestPrompt] | None = None, *, memory: str | None = None,
                    gpu: Card | None = None, with_time: bool = True) -> Plan:
    """The plan of a ``run`` config; reads configs and prompts only. ``memory`` or ``gpu``
    plan for another machine."""
    if prompts is None:
        from weightgraft.data.freeform import load_prompts
        from weightgraft.experiments.examples import select_prompts

        prompts = select_prompts(load_prompts(config.data), config)
    shapes, lengths = _set_shapes(config, prompts)
    where = budget(config.device, memory, all_gpus=config.device_map is not None, gpu=gpu)
    fixed = config.batch_size if "batch_size" in config.model_fields_set else None
    settings = RunSettings(dtype=config.dtype, lean=config.lean_donors and config.device_map is None, batch_fixed=fixed,
                           device_map=config.device_map is not None, held_now=where.held, sets=shapes)
    n_rows = max(len(s.rows) for s in shapes)
    batch = choose_batch(fixed, DEFAULT_RUN_BATCH, n_rows, settings.memory_at, HEADROOM * where.limit)
    notes = ["prefix sharing (on by default) computes shared positions once: the time is an upper bound"
             if config.prefix_sharing and config.dtype == "float32" else "rows run whole"]
    quantized = {r.spec.text: (r.role, r.spec.text, r.footprint) for s in shapes for r in s.roles
                 if r.footprint.quantization is not None and r.spec.adapter is None}
    notes += quantized_notes(list(quantized.values()), config.dtype)
    seconds, parts = None, {}
    if with_time:
        rate, note = rate_for(config.device, config.dtype, gpu)
        if note:
            notes.append(note)
        roles = [r for s in shapes for r in held(s, config.dtype, settings.lean)]
        if rate is not None:
            parts = {f"sweep {s.name}": forward_seconds(s.base, s.rows, batch, rate) for s in shapes}
            on_card, _ = card_for(config.device, gpu)
            if on_card is not None:
                reads, read_note = weight_read_seconds(_loaded_once(roles), on_card)
                parts.update(reads)
                notes.append(read_note)
            seconds = sum(parts.values())
    plan = Plan(kind="run", device=config.device, dtype=config.dtype,
                roles=[r for s in shapes for r in held(s, config.dtype, settings.lean)], prompts=lengths,
                rows=sum(len(s.rows) for s in shapes), batch_size=batch, batch_size_fixed=fixed is not None,
                batches=sum(math.ceil(len(s.rows) / batch) for s in shapes), memory=settings.memory_at(batch),
                budget_bytes=where.limit, budget_source=where.source, predicted_seconds=seconds, time_parts=parts,
                notes=notes)
    if plan.fits:
        return plan
    advice, least = run_advice(settings, where.limit, _spread(config, memory, gpu), gpu.name if gpu else None)
    return replace(plan, suggestions=advice, least=least)


def _loaded_once(roles: list[RolePlan]) -> list[int]:
    """Bytes each model a run loads reads (a quantized role: dense, quantized as it loads): a
    spec held the same way in several sets loads once."""
    return list({(r.spec, r.holds): r.loaded_bytes for r in roles}.values())


def plan_before_run(config: ExperimentConfig, prompts: list[TestPrompt]) -> ExperimentConfig:
    """What ``run`` does before loading: refuse random models (no tokenizer) and a plan that
    does not fit, in one line; return the config with the plan's batch size where the config
    does not fix one."""
    from weightgraft.models.spec import refuse_random

    for roles in config.spec_sets().values():
        if config.tokenizer is None:  # the config's tokenizer serves models that have none
            refuse_random(roles, "weightgraft run")
    return with_planned_batch(config, lambda: plan_experiment(config, prompts, with_time=False))
