"""What a localize config asks of memory and time, as ``weightgraft.planning`` reads it: the
prompts each stage grafts and the most rows one call of it holds (``plan_input``)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from weightgraft.localization.config import LocalizeConfig
from weightgraft.localization.prompts import select_prompts

if TYPE_CHECKING:
    from weightgraft.planning.localize import LocalizeWork


def plan_input(config: LocalizeConfig, prompts: list[Any] | None = None) -> LocalizeWork:
    """What this config asks of memory and time, as ``weightgraft.planning`` reads it."""
    from weightgraft.models.spec import parse_spec
    from weightgraft.planning.localize import LocalizeWork, SftModel

    prompts = select_prompts(config) if prompts is None else prompts
    exact, count = [], defaultdict(int)
    for p in prompts:  # the prompts ``_exact_subset`` maps exactly: all, none, or the first N per template
        if config.exact == "all" or (config.exact != "none" and count[p.template] < config.exact):
            count[p.template] += 1
            exact.append(p.prompt)
    sfts = []
    for label, spec in config.mapped_models():
        lora = parse_spec(spec).adapter
        sfts.append(SftModel(label=label, spec=spec, adapter=lora[1] if lora is not None else None))
    return LocalizeWork(pre=config.models["pre"], sfts=sfts, prompts=[p.prompt for p in prompts], exact_prompts=exact,
                        exact_references=_exact_references(config, prompts, len(exact)),
                        set_rows=_set_rows(config, prompts), claim_prompts=_claim_prompts(config, prompts),
                        claim_position_sets=4 * 3 + 3 * config.claims.null_draws + 1,
                        claim_last_sets=3 * 3 + 2 * config.claims.null_draws,
                        **_search_work(config, prompts),
                        directions=len(config.graft_directions), ig_steps=config.ig_steps, units=config.units,
                        unit_rows=config.unit_rows, exact_units=config.exact_units, exact_chunk=config.exact_chunk,
                        batch_size=config.batch_size if "batch_size" in config.model_fields_set else None,
                        dtype=config.dtype, device=config.device, tokenizer=config.tokenizer, estimates=config.estimates)


def _search_work(config: LocalizeConfig, prompts: list[Any]) -> dict[str, Any]:
    """The search's exact set grafts per prompt, for its time. The found set's size is taken at
    ``max_cells`` (an upper bound: the search stops where the target is met; on the demo pair it
    reaches the cap), and refinement as halving the set each round (a round grafts the set
    without each of its cells; a round that removes fewer cells costs more, up to
    ``refine_rounds`` x ``max_cells`` sets)."""
    from weightgraft.localization.found_sets import split_prompts
    from weightgraft.localization.search import growing_sizes

    s = config.search
    if not s.enabled:
        return {}
    by_template: dict[str, list[Any]] = defaultdict(list)
    for p in prompts:
        by_template[p.template].append(p)
    fit, held = [], []
    for template, group in by_template.items():
        split = split_prompts([p.id for p in group], config.seed, template, s.heldout)
        fit += [p.prompt for p in group if p.id in set(split["fit_ids"])]
        held += [p.prompt for p in group if p.id in set(split["heldout_ids"])]
    size, refine, rounds = s.max_cells, 0, 0
    while s.refine and size > 1 and rounds < s.refine_rounds:
        refine += size + len(bin(size)) - 2  # each cell left out, then the blocks tried
        size, rounds = size // 2, rounds + 1
    sets_kept = 2 if s.refine else 1  # the found set and the refined one are both controlled
    controls = 2 * s.controls * sets_kept
    search_sets = len(growing_sizes(s.max_cells)) + s.max_cells.bit_length()  # prefixes, then the bisection
    note = (f"search: up to {s.max_cells} cells verified on {len(fit)} fit prompts ({search_sets} prefix sets), "
            f"refinement taken as halving the set each round ({refine} sets), {controls} control sets, "
            f"{2 * s.missed_sample} missed-sample cells; an upper bound where the target is met early")
    return {"search_fit_prompts": fit, "search_heldout_prompts": held,
            "search_fit_sets": search_sets + refine + controls + 2 * s.missed_sample,
            "search_heldout_sets": sets_kept + controls, "search_note": note}


def _claim_prompts(config: LocalizeConfig, prompts: list[Any]) -> list[str]:
    """The prompts the claims graft: each template's first ``claims.prompts`` (all by default)."""
    if not config.claims.enabled:
        return []
    count: dict[str, int] = defaultdict(int)
    out = []
    for p in prompts:
        if config.claims.prompts is None or count[p.template] < config.claims.prompts:
            count[p.template] += 1
            out.append(p.prompt)
    return out


def _per_template(config: LocalizeConfig, prompts: list[Any]) -> list[tuple[int, int]]:
    """Per template, the most prompts one call of its search (fit or held-out half) and of its
    claims grafts (0 where that stage is off)."""
    from weightgraft.localization.found_sets import split_prompts

    by_template: dict[str, list[str]] = defaultdict(list)
    for p in prompts:
        by_template[p.template].append(p.id)
    out = []
    for template, ids in by_template.items():
        search = 0
        if config.search.enabled:
            split = split_prompts(ids, config.seed, template, config.search.heldout)
            search = max(len(split["fit_ids"]), len(split["heldout_ids"]))
        claims = min(len(ids), config.claims.prompts or len(ids)) if config.claims.enabled else 0
        out.append((search, claims))
    return out


def _set_rows(config: LocalizeConfig, prompts: list[Any]) -> int:
    """The most (prompt, set) rows one call of the search's stages or of the claims grafts: a
    refinement round (the set without each of up to ``max_cells`` cells), the controls (the
    found set and both kinds' draws), the missed-effect sample (below and above the cut), the
    claims (each claim's region, its part within and its null regions)."""
    from weightgraft.localization.claims.regions import CLAIMS

    s = config.search
    per_search = max(s.max_cells if s.refine else 0, 1 + 2 * s.controls, 2 * s.missed_sample, 1)
    per_claims = len(CLAIMS) * (3 + config.claims.null_draws) + 32  # regions, within, rest, draws, layer blocks
    calls = [n * (1 + sets) for search, claims in _per_template(config, prompts)
             for n, sets in ((search, per_search), (claims, per_claims))]  # each prompt's base is a row too
    return max(calls, default=0)


def _exact_references(config: LocalizeConfig, prompts: list[Any], n_exact: int) -> int:
    """The reference rows depth sharing holds in the largest ``exact_effects`` call: an exact-map
    group's bases (single cells share with their base alone), a template's fit or held-out prompts
    (search, refinement, controls, missed sample) or its claim prompts, each with its base and the
    union of its sets (0: no stage computes exact effects)."""
    from weightgraft.localization.exact_parts import EXACT_GROUP

    out = min(EXACT_GROUP, n_exact)
    for search, claims in _per_template(config, prompts):
        out = max(out, 2 * search, 2 * claims)
    return out
