"""The plan of a ``run`` config, before any weight is read (``run`` checks it in
:func:`weightgraft.planning.preflight.preflight`, as every pipeline does).

Why: a sweep on a 2B or 8B model that cannot fit should be refused in one line, saying what
would make it fit (or that nothing in the config would), not die an hour in; and a user should
know how long it will take. This module reads the config (model sets, schemes, prompts) into
the shapes ``weightgraft.planning`` computes with: each role's ``config.json`` built on the
meta device, the prompts tokenized (or estimated) and the schemes compiled into source maps.
"""

from __future__ import annotations

from weightgraft.data.prompts import TestPrompt
from weightgraft.experiments.config import ConfigError, ExperimentConfig
from weightgraft.models.footprint import ModelFootprint
from weightgraft.models.spec import ModelSpec
from weightgraft.planning.cards import Card
from weightgraft.planning.graftable import check_graftable
from weightgraft.planning.lengths import PromptLengths, length_summary, refuse_media, tokenizer_for
from weightgraft.planning.plan import Plan
from weightgraft.planning.run import RoleShape, SetShape, SweepChoices, plan_sweep

__all__ = ["DEFAULT_RUN_BATCH", "plan_experiment"]

DEFAULT_RUN_BATCH = 64  # ExperimentConfig.batch_size's default: the most a plan chooses


def _role_footprint(spec: ModelSpec, roles_spec: dict[str, ModelSpec], cache: dict[str, ModelFootprint]) -> ModelFootprint:
    """The footprint of a role's shapes: a low-rank role has its donor's, a LoRA role its base's."""
    while (shaped := spec.shape_role()) is not None:
        spec = roles_spec[shaped]
    if spec.text not in cache:
        cache[spec.text] = spec.footprint()
    return cache[spec.text]


def _set_shapes(config: ExperimentConfig, prompts: list[TestPrompt]) -> tuple[list[SetShape], PromptLengths]:
    """Per model set: its roles' footprints, the (tokens, logits) of every (example, scheme)
    row and the bytes of the source maps; and the prompts' lengths."""
    from weightgraft.engine.architectures import model_slots
    from weightgraft.experiments.examples import Exclusions, prepare, served_experts, served_slots
    from weightgraft.schemes.binding import compile_for

    schemes = config.resolved_schemes()
    footprints: dict[str, ModelFootprint] = {}
    shapes: list[SetShape] = []
    lengths = PromptLengths()
    for set_name, roles_spec in config.spec_sets().items():
        used = sorted(set().union(*(s.roles() for s in schemes)), key=list(roles_spec).index)
        base = _role_footprint(roles_spec[used[0]], roles_spec, footprints)
        names = base.slot_names
        compiled = compile_for(schemes, base.meta, used, config.protocol)
        tok, how = tokenizer_for(base, config.tokenizer)
        prepared = prepare(prompts, tok, compiled, set_name, Exclusions())
        refuse_media(base, tok, ((ex.prompt.prompt, ex.input_ids) for ex in prepared))
        if not prepared:
            raise ConfigError(f"model set {set_name!r}: every example is excluded (spans not found); nothing to plan")
        served = served_slots(prepared, names)
        experts = served_experts(prepared, names, [n for n, s in zip(names, model_slots(base.meta)) if s.experts])
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
                           served=served.get(i, set()) if i else None, experts=experts.get(i, {}) if i else {})
                 for i, role in enumerate(used)]
        for r in roles[1:]:
            check_graftable(used[0], base, r.role, r.footprint)
        shapes.append(SetShape(name=set_name, base=base, roles=roles, rows=rows, source_bytes=source_bytes))
    return shapes, lengths


def plan_experiment(config: ExperimentConfig, prompts: list[TestPrompt] | None = None, *, memory: str | None = None,
                    gpu: Card | None = None, with_time: bool = True) -> Plan:
    """The plan of a ``run`` config; reads configs and prompts only. ``memory`` or ``gpu``
    plan for another machine."""
    if prompts is None:
        from weightgraft.data.freeform import load_prompts
        from weightgraft.experiments.examples import select_prompts

        prompts = select_prompts(load_prompts(config.data), config)
    shapes, lengths = _set_shapes(config, prompts)
    fixed = config.batch_size if "batch_size" in config.model_fields_set else None
    choices = SweepChoices(device=config.device, dtype=config.dtype, batch_fixed=fixed, batch_default=DEFAULT_RUN_BATCH,
                           lean=config.lean_donors, device_map=config.device_map is not None,
                           prefix_sharing=config.prefix_sharing, memory=memory, gpu=gpu, with_time=with_time)
    return plan_sweep(shapes, lengths, choices)
