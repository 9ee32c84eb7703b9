"""The claims stage of ``localize``: for one model pair and graft direction, every template's
claims as exact region grafts against their null (``grafts``), stored in ``parts/`` under
a digest of the claims' settings and of the prompts they judge (a rerun with the same reads them;
other settings, prompts added to a template or more of them mapped exactly compute anew) and
gathered into ``claims.csv`` (judged as one family) and ``claims_prompts.parquet``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from weightgraft import atomic
from weightgraft.configfile import json_digest
from weightgraft.engine.architectures import model_slots, part_state
from weightgraft.engine.attribution import Metric
from weightgraft.engine.metric_table import localize_metric
from weightgraft.engine.source_map import SlotName
from weightgraft.localization.claims.control import against_control
from weightgraft.localization.claims.grafts import ClaimMap, judge_claims
from weightgraft.localization.claims.regions import CLAIMS, RULES_VERSION, Claim
from weightgraft.localization.claims.verdicts import MIN_PROMPTS, decide, p_text
from weightgraft.localization.examples import LocalizeExample
from weightgraft.localization.maps import cell_map, whole_cells
from weightgraft.localization.verify import SetVerifier

DECIDED = ["p", "p_parts", "p_holm", "verdict", "reason"]
PLAIN = "first_logprob"  # the plain effect kept beside the claims' own in every row
FIRST = ["model", "template", "direction", "setting", "claim", "n_prompts", "evidence", "within_effect", "share_exact",
         "ci_low", "ci_high", "ci_level", "share_plain", "null_kind", "null_mean", "threshold_p", "null_p", "share_estimate",
         "share_exact_cells", "interaction", "region_cells_share", "region_params_share"]


def slot_params(model: nn.Module) -> dict[str, int]:
    """Parameters per slot: the tensors each part owns (a mixer's ``A_log`` / ``dt_bias``, an
    attention's ``sinks``: those, not their whole module), so that parameter-matched nulls and
    thresholds weigh a slot by what grafting it moves; a slot that owns some output columns of a
    fused projection (GPT-2's ``c_attn``) counts that fraction of it."""

    out: dict[str, int] = {}
    for slot in model_slots(model):
        total = 0.0
        for part in slot.parts:
            n = sum(t.numel() for _, t in part_state(model, part) if isinstance(t, nn.Parameter))
            if part.columns is not None:
                module = model.get_submodule(part.path)
                width = getattr(module, "out_features", None) or getattr(module, "nf", None)
                n = n * len(part.columns) / width if width else n
            total += n
        out[slot.name] = int(round(total))
    return out


def _groups(examples: Sequence[LocalizeExample], settings: Any) -> dict[str, list[LocalizeExample]]:
    """Per template, the prompts its claims are judged on (the first ``settings.prompts``)."""
    templates = dict.fromkeys(e.prompt.template for e in examples)
    return {t: [e for e in examples if e.prompt.template == t][: settings.prompts] for t in templates}


def _judged(examples: Sequence[LocalizeExample], frame: pd.DataFrame, settings: Any) -> list[list[Any]]:
    """What a map's claims read besides their settings: each judged prompt (its content, its tokens,
    labels and contrasts, which prompts added to its template change) and how many of its cells
    have exact effects (a raised ``exact:`` maps more); the rest of the map is the claimed models'
    on those prompts."""
    exact = frame[frame["exact"].notna()].groupby(["template", "example_id"]).size() if "exact" in frame else {}
    return [[json_digest(dataclasses.asdict(e.prompt)), json_digest(dataclasses.asdict(e.scored)), list(e.labels),
             int(exact.get((e.prompt.template, e.prompt.id), 0))]
            for group in _groups(examples, settings).values() for e in group]


def _digest(settings: Any, seed: int, metric: str, setting: str, claims: Sequence[Claim], precondition: str,
            judged: list[list[Any]]) -> str:
    data = {"settings": settings.model_dump(mode="json"), "seed": seed, "metric": metric, "setting": setting,
            "claims": [c.name for c in claims], "precondition": precondition, "version": RULES_VERSION,
            "prompts": json_digest(judged)}
    return json_digest(data, 12)


def map_claims(models: Sequence[nn.Module], examples: Sequence[LocalizeExample], estimates: pd.DataFrame,
               *, model_label: str, direction: str, setting: str, settings: Any, seed: int, pad_id: int,
               metric: Metric, chunk: int, parts: Path, say: Callable[..., None],
               claims: Sequence[Claim] = CLAIMS, precondition: str = "") -> tuple[pd.DataFrame, pd.DataFrame]:
    """claims.csv rows and their per-prompt effects of one pair and direction, read from
    ``parts`` where an earlier run with the same settings wrote them. Effects are in
    ``settings.metric`` (``fact_logprob`` by default), with the plain ``first_logprob`` effect
    beside them from the same passes; ``metric`` is the one the gradient ``estimates`` were taken in."""

    frame = whole_cells(estimates)
    frame = frame[frame["direction"] == direction]
    digest = _digest(settings, seed, metric, setting, claims, precondition, _judged(examples, frame, settings))
    stem = parts / f"claims_{setting.replace('->', '_').replace(' ', '_')}_{direction}_{digest}"
    table, prompt_path = stem.with_suffix(".parquet"), stem.parent / f"{stem.name}_prompts.parquet"
    if table.is_file() and prompt_path.is_file():
        return pd.read_parquet(table), pd.read_parquet(prompt_path)
    index = {s.name: i for i, s in enumerate(model_slots(models[0]))}
    params = slot_params(models[0])
    metrics = (settings.metric, PLAIN)
    estimates_of = {settings.metric: "share_exact", PLAIN: "share_plain"}.get(metric, "")
    n_layers = 1 + max(layer for name in index if (layer := SlotName.parse(name).layer) is not None)
    rows, prompts = [], []
    needs_answers = localize_metric(settings.metric).needs_answers
    for template, group in _groups(examples, settings).items():
        alone = [e.prompt.id for e in group if needs_answers and not e.scored.other_answers]
        if alone:  # every answer of the template starts with one token: no other answer to contrast
            say(f"[{direction}/{template}] claims not judged in {settings.metric}: {len(alone)} of {len(group)} "
                "prompt(s) have no other answer with another first token (set claims.metric: first_logprob "
                "for the plain effect)")
            continue
        maps = [cell_map(e, index, models[0]) for e in group]
        verifier = SetVerifier(models, [e.scored for e in group], maps, pad_id, settings.metric, chunk, total=1.0)
        by_id = {k: g for k, g in frame[frame["template"] == template].groupby("example_id")}
        est, exact = [], []
        for e in group:
            g = by_id.get(e.prompt.id)
            est.append({} if g is None else dict(zip(zip(g["position_label"], g["slot"]), g["estimate"])))
            if g is not None and "exact" in g:
                g = g[g["exact"].notna()]
                exact.append(dict(zip(zip(g["position_label"], g["slot"]), g["exact"])))
            else:
                exact.append({})
        data = ClaimMap([set(m) for m in maps], est, lambda sets, verifier=verifier: verifier.per_prompt_sets_in(sets, metrics).numpy(),
                        params, n_layers, exact, [e.prompt.id for e in group])
        found, per_prompt = judge_claims(data, f"{model_label}/{template}/{direction}", setting, claims=claims,
                                         draws=settings.null_draws, seed=seed, n_resamples=settings.resamples, precondition=precondition,
                                         sign=1 if direction == "sufficiency" else -1, estimates_of=estimates_of)
        for r in found:  # the paper grafted the donor into the base: sufficiency
            r.update(model=model_label, template=template, direction=direction, rules=RULES_VERSION,
                     in_paper_setting=bool(r["in_paper_setting"] and direction == "sufficiency"),
                     evidence="exploratory" if r["n_prompts"] < MIN_PROMPTS else "confirmatory")
            r["note"] = "" if r["in_paper_setting"] else f"outside the paper's setting ({r['paper_setting']}, sufficiency)"
        rows += found
        prompts.append(per_prompt.assign(model=model_label, template=template, direction=direction, setting=setting))
        say(f"[{direction}/{template}] claims ({setting}, {settings.metric}): "
            + ", ".join(f"{r['claim']} share {r['share_exact']:.2f} p {p_text(r['p'], r['least_p'])}"
                        for r in found if r["null_kind"] != "none")
            + " (verdicts: one Holm family over the run, in claims.csv)")
    # a map's rows carry evidence only: the verdict is the run's, decided once over every map (write_claims)
    out = pd.DataFrame(rows).drop(columns=[c for c in DECIDED if c in rows[0]] if rows else [])
    out = out[FIRST + [c for c in out.columns if c not in FIRST]] if rows else pd.DataFrame(columns=FIRST)
    per = pd.concat(prompts, ignore_index=True) if prompts else pd.DataFrame()
    with atomic.atomic_path(table) as tmp:
        out.to_parquet(tmp, index=False)
    with atomic.atomic_path(prompt_path) as tmp:
        per.to_parquet(tmp, index=False)
    return out, per


def write_claims(run_dir: Path, tables: Sequence[pd.DataFrame], prompts: Sequence[pd.DataFrame], *,
                 control: str | None = None, seed: int = 0, n_resamples: int = 9999) -> pd.DataFrame | None:
    """``claims.csv`` (one row per claim and map; every judged row of the run one Holm family, each
    fact claim tested against the ``control`` finetune's same region where the run has one) and
    ``claims_prompts.parquet`` (each row's per-prompt effects: any row can be recomputed)."""
    tables = [t for t in tables if len(t)]
    prompts = [p for p in prompts if len(p)]
    if not tables:
        return None
    table = pd.concat(tables, ignore_index=True)
    if control is not None:
        table = against_control(table, pd.concat(prompts, ignore_index=True), control=control, seed=seed,
                                n_resamples=n_resamples)
    table = decide(table)
    atomic.write_text(run_dir / "claims.csv", table.to_csv(index=False))
    with atomic.atomic_path(run_dir / "claims_prompts.parquet") as tmp:
        pd.concat(prompts, ignore_index=True).to_parquet(tmp, index=False)
    return table
