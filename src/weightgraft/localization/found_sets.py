"""The found-sets stage of ``localize``: per (direction, template), the minimal graft search,
then its exact greedy refinement, random and matched controls of both sets, and an estimate of
what the ranking missed; written to ``search.json`` (:class:`~weightgraft.resume.manifests.SearchRecord`,
through the run's folder) after each step, so a killed run (or a run made before a step existed)
continues from what is there.

A keyed stage of the run's folder (:func:`search_stage`): keyed by what the sets depend on (the
searched model's map, the prompts and their split's seed, the search's settings, the metric,
units and dtype), a resumed run whose key is recorded in ``stages.json`` reads ``search.json``
back and runs nothing; a changed input (prompts added to the data) searches again, each entry
whose fit prompts are unchanged kept.

Each template's prompts are split (seeded, ``splits`` in search.json: ``fit_ids``,
``heldout_ids``): the search, the refinement and the missed-effects sample see the fit prompts
only; every set's share and its controls are also measured on the held-out prompts
(``heldout_share``, ``controls.{kind}.heldout``).

Each entry also says how many of its set's cells each prompt actually received: a key at a
label a prompt lacks (``first_entity_last-3`` in a two-token name) grafts nothing there.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
from torch import nn

from weightgraft.configfile import ConfigError, json_digest
from weightgraft.engine.architectures import Units, model_slots
from weightgraft.engine.cells import WHOLE, cell_name
from weightgraft.localization.controls import set_controls
from weightgraft.localization.examples import LocalizeExample
from weightgraft.localization.maps import UnitCellMap, cell_map, whole_cells
from weightgraft.localization.missed import missed_estimate
from weightgraft.localization.refine import refine_set
from weightgraft.localization.search import minimal_graft_search, rank_keys
from weightgraft.localization.verify import CellKey, SetVerifier, received_summary
from weightgraft.resume.folder import RunFolder
from weightgraft.resume.manifests import SearchRecord
from weightgraft.resume.stages import FolderStage, frame_digest

MAP_COLUMNS = ["direction", "template", "example_id", "position_label", "slot", "unit"]


def _keys(cells: list[dict[str, str]]) -> list[CellKey]:
    return [(c["position_label"], c["slot"]) for c in cells]


def _estimates(sub: pd.DataFrame, column: str, units: Units, model: nn.Module) -> dict[CellKey, float]:
    """Summed estimate per key: whole cells, or with units the unit cells (and rests) of the
    split slots and the whole cells of the others."""
    if units == Units.CELL:
        sub = whole_cells(sub)
        return {k: float(v) for k, v in sub.groupby(["position_label", "slot"])[column].sum().items()}

    split = {s.name for s in model_slots(model) if s.units(units)}
    keep = (sub["unit"] != WHOLE) | ~sub["slot"].isin(split)
    sub = sub[keep]
    names = [cell_name(s, int(u)) for s, u in zip(sub["slot"], sub["unit"])]
    sums = sub[column].groupby([sub["position_label"].to_numpy(), pd.Series(names, index=sub.index)]).sum()
    return {(str(label), str(name)): float(v) for (label, name), v in sums.items()}


def split_prompts(ids: Sequence[str], seed: int, template: str, heldout: float) -> dict[str, Any]:
    """A template's prompts split into a fit half (searched and refined on) and a held-out half
    (never seen by the search), by a seeded shuffle (``random.Random(seed string)``)."""
    s = f"{seed}:{template}:split"
    order = list(ids)
    random.Random(s).shuffle(order)
    n_held = int(round(len(order) * heldout)) if len(order) > 1 else 0
    n_held = min(n_held, len(order) - 1)
    held = set(order[:n_held])
    return {"seed": s, "heldout_fraction": heldout, "fit_ids": [i for i in ids if i not in held],
            "heldout_ids": [i for i in ids if i in held]}


def _maps(config: Any, group: Sequence[LocalizeExample], slot_index: dict[str, int], model: nn.Module,
          estimates: dict[CellKey, float]) -> tuple[list, list]:
    whole = [cell_map(e, slot_index, model) for e in group]
    units = whole if config.units == Units.CELL else [UnitCellMap(e, slot_index, model, list(estimates)) for e in group]
    return whole, units


def _column(config: Any, cells: pd.DataFrame) -> str:
    """The estimate the search ranks cells by."""
    column = "estimate_ig" if config.search.rank_by == "ig" else "estimate"
    if column not in cells:
        raise ConfigError("search.rank_by 'ig' needs ig_steps > 1")
    return column


def search_inputs(config: Any, examples: Sequence[LocalizeExample], cells: pd.DataFrame,
                  model: tuple[str, str]) -> dict[str, Any]:
    """What the found sets depend on, the search stage's key: the searched model (label, spec),
    its map (every cell's ranking estimate), the prompts (their content), the seed that splits
    them, the search's settings, the metric, units, directions and dtype."""
    column = _column(config, cells)
    cols = [c for c in MAP_COLUMNS if c in cells] + [column]
    return {"model": list(model), "map": frame_digest(cells[cols]),
            "prompts": json_digest(sorted(json_digest(dataclasses.asdict(e.prompt)) for e in examples)),
            "seed": config.seed, "search": config.search.model_dump(mode="json"), "metric": config.metric,
            "units": str(config.units), "directions": list(config.graft_directions), "dtype": config.dtype}


def search_stage(config: Any, folder: RunFolder, examples: Sequence[LocalizeExample], *, cells: pd.DataFrame,
                 pairs: dict[str, list[nn.Module]], model: nn.Module, pad_id: int, label: tuple[str, str],
                 say: Callable[..., None], seconds: dict[str, float]) -> SearchRecord:
    """The found sets as a keyed stage of the run's folder (``label``: the searched model's label
    and spec): ``search.json`` read back where the folder's ``stages.json`` holds this key, else
    searched (:func:`find_sets`) and the stage recorded. Without the search: an empty record."""
    if not config.search.enabled:
        return SearchRecord()
    stage = FolderStage(folder, "search", search_inputs(config, examples, cells, label), (SearchRecord.FILE,))
    record, reused = stage.run(
        lambda: find_sets(config, folder, examples, cells=cells, pairs=pairs, model=model, pad_id=pad_id,
                          model_label=label[0], say=say, seconds=seconds),
        lambda: folder.read(SearchRecord) or SearchRecord())
    if reused:
        say(f"found sets: read back from {folder.path / SearchRecord.FILE} (searched with these inputs)")
    return record


def find_sets(config: Any, folder: RunFolder, examples: Sequence[LocalizeExample], *, cells: pd.DataFrame,
              pairs: dict[str, list[nn.Module]], model: nn.Module, pad_id: int, model_label: str,
              say: Callable[..., None], seconds: dict[str, float]) -> SearchRecord:
    """``search.json``: every (direction, template)'s found set, refined set, controls and
    missed-effects estimate, searched on the template's fit prompts and reported on its
    held-out prompts beside them; each step computed only where the file lacks it."""
    settings = config.search
    slot_index = {s.name: i for i, s in enumerate(model_slots(model))}
    column = _column(config, cells)
    found_record = folder.read(SearchRecord)
    entries = {(e["direction"], e["template"]): e for e in (found_record.searches if found_record else [])}
    out = (found_record or SearchRecord()).updated(metric=config.metric, rank_by=column, searches=[], splits={},
                                                   model=model_label)
    for direction in config.graft_directions:
        for template in dict.fromkeys(e.prompt.template for e in examples):
            t0 = time.time()
            everything = [e for e in examples if e.prompt.template == template]
            split = split_prompts([e.prompt.id for e in everything], config.seed, template, settings.heldout)
            out.splits[template] = split
            group = [e for e in everything if e.prompt.id in set(split["fit_ids"])]
            held = [e for e in everything if e.prompt.id in set(split["heldout_ids"])]
            ids = [e.prompt.id for e in group]
            sub = cells[(cells["direction"] == direction) & (cells["template"] == template)
                        & cells["example_id"].isin(ids)]
            estimates = _estimates(sub, column, config.units, model)
            whole_maps, maps = _maps(config, group, slot_index, model, estimates)
            entry = entries.get((direction, template))
            if entry is not None and (config.metric != "first_logprob" and not entry.get("search_checked")
                                      or entry.get("fit_ids") != split["fit_ids"]):
                entry = None  # searched on other prompts, or before shares were measured in the metric: again
            total = None
            if config.units != Units.CELL:  # the donor's whole effect: every whole cell (the unit keys are a top few)
                total = SetVerifier(pairs[direction], [e.scored for e in group], whole_maps, pad_id, config.metric,
                                    config.exact_chunk).total
            if entry is None:
                result = minimal_graft_search(pairs[direction], [e.scored for e in group], maps, estimates=estimates, pad_id=pad_id,
                                              target_share=settings.target_share, max_cells=settings.max_cells, chunk=config.exact_chunk,
                                              metric=config.metric, total=total)
                entry = {"direction": direction, "template": template, "n_examples": len(group),
                         "fit_ids": split["fit_ids"], "heldout_ids": split["heldout_ids"],
                         "search_checked": True, **result.to_json()}
                say(f"[{direction}/{template}] {len(result.cells)} cells carry {result.share:.0%} of the fit prompts' "
                    f"effect ({'reached' if result.reached else 'NOT reached'})")
            verifier = SetVerifier(pairs[direction], [e.scored for e in group], maps, pad_id, config.metric,
                                   config.exact_chunk, entry["total_effect"])
            heldout = None
            if held:
                held_whole, held_maps = _maps(config, held, slot_index, model, estimates)
                held_total = None if config.units == Units.CELL else SetVerifier(
                    pairs[direction], [e.scored for e in held], held_whole, pad_id, config.metric,
                    config.exact_chunk).total
                heldout = SetVerifier(pairs[direction], [e.scored for e in held], held_maps, pad_id, config.metric,
                                      config.exact_chunk, held_total)
            out.searches.append(entry)
            found = _keys(entry["cells"])
            entry["received"] = received_summary(verifier, found, ids)
            if heldout is not None and "heldout_share" not in entry:
                entry["heldout_share"] = heldout.shares([found])[0]
                entry["heldout_total_effect"] = heldout.total
            tag = f"[{direction}/{template}]"
            if settings.refine and "refined" not in entry:
                entry["refined"] = refine_set(
                    verifier, found, entry["share"], settings.target_share, settings.refine_rounds,
                    lambda r, n, sh, tag=tag: say(f"{tag} refinement round {r}: {n} cells, share {sh:.0%}"))
                folder.write(out)
                say(f"{tag} refined: {entry['size']} -> {entry['refined']['size']} cells, "
                    f"share {entry['refined']['share']:.0%}")
            if "refined" in entry:
                r = entry["refined"]
                r["received"] = received_summary(verifier, _keys(r["cells"]), ids)
                if heldout is not None and "heldout_share" not in r:
                    r["heldout_share"] = heldout.shares([_keys(r["cells"])])[0]
            if settings.controls and not (entry.get("controls") or {}).get("from_complement"):
                entry["controls"] = set_controls(verifier, found, entry["share"], n_sets=settings.controls, seed=config.seed,
                                                 direction=direction, template=template, heldout=heldout, heldout_share=entry.get("heldout_share"))
                if "refined" in entry:
                    r = entry["refined"]
                    r["controls"] = set_controls(verifier, _keys(r["cells"]), r["share"], n_sets=settings.controls,
                                                 seed=config.seed, direction=direction, template=template, heldout=heldout, heldout_share=r.get("heldout_share"))
                folder.write(out)
                c = entry["controls"]
                if "mean" in c.get("random", {}):
                    say(f"{tag} controls: found {entry['share']:.0%} vs random mean {c['random']['mean']:.0%} "
                        f"(p = {c['random']['p']:.3g}), matched mean {c.get('matched', {}).get('mean', float('nan')):.0%}")
            if settings.missed_sample and "rules_out" not in (entry.get("missed") or {}):
                ranking = rank_keys(estimates, 1.0 if verifier.total > 0 else -1.0)
                entry["missed"] = missed_estimate(verifier, ranking, entry["size"], sample_size=settings.missed_sample,
                                                  seed=config.seed, direction=direction, template=template)
                folder.write(out)
            seconds[f"search_{direction}_{template}"] = time.time() - t0
            folder.write(out)
    return out
