"""The found-sets stage of ``localize``: per (direction, template), the minimal graft search,
then its exact greedy refinement, random and matched controls of both sets, and the bound on
what the ranking missed; written to ``search.json`` after each step, so a killed run (or a run
made before a step existed) continues from what is there.

Each entry also says how many of its set's cells each prompt actually received: a key at a
label a prompt lacks (``first_entity-3`` in a two-token name) grafts nothing there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from weightgraft import atomic
from weightgraft.experiments.config import ConfigError
from weightgraft.localize.controls import set_controls
from weightgraft.localize.examples import LocalizeExample
from weightgraft.engine.cells import WHOLE, cell_name
from weightgraft.localize.maps import UnitCellMap, cell_map, whole_cells
from weightgraft.localize.missed import missed_bound
from weightgraft.localize.refine import refine_set
from weightgraft.localize.search import minimal_graft_search, rank_keys
from weightgraft.localize.verify import CellKey, SetVerifier, received_summary


def _keys(cells: list[dict[str, str]]) -> list[CellKey]:
    return [(c["position_label"], c["slot"]) for c in cells]


def _estimates(sub: pd.DataFrame, column: str, units: str, model: nn.Module) -> dict[CellKey, float]:
    """Summed estimate per key: whole cells, or with units the unit cells (and rests) of the
    split slots and the whole cells of the others."""
    if units == "cell":
        sub = whole_cells(sub)
        return {k: float(v) for k, v in sub.groupby(["position_label", "slot"])[column].sum().items()}
    from weightgraft.engine.architectures import model_slots

    split = {s.name for s in model_slots(model) if s.units(units)}
    keep = (sub["unit"] != WHOLE) | ~sub["slot"].isin(split)
    sub = sub[keep]
    names = [cell_name(s, int(u)) for s, u in zip(sub["slot"], sub["unit"])]
    sums = sub[column].groupby([sub["position_label"].to_numpy(), pd.Series(names, index=sub.index)]).sum()
    return {(str(label), str(name)): float(v) for (label, name), v in sums.items()}


def find_sets(config: Any, run_dir: Path, examples: Sequence[LocalizeExample], cells: pd.DataFrame,
              pairs: dict[str, list[nn.Module]], model: nn.Module, pad_id: int,
              say: Callable[..., None], seconds: dict[str, float]) -> dict[str, Any]:
    """``search.json``: every (direction, template)'s found set, refined set, controls and
    missed-effects bound, each step computed only where the file lacks it."""
    settings = config.search
    path = run_dir / "search.json"
    if not settings.enabled:
        return {}
    from weightgraft.engine.architectures import model_slots

    slot_index = {s.name: i for i, s in enumerate(model_slots(model))}
    column = "estimate_ig" if settings.rank_by == "ig" else "estimate"
    if column not in cells:
        raise ConfigError("search.rank_by 'ig' needs ig_steps > 1")
    out: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    out.update({"metric": config.metric, "rank_by": column})
    entries = {(e["direction"], e["template"]): e for e in out.get("searches", [])}
    out["searches"] = []
    for direction in config.graft_directions:
        for template in dict.fromkeys(e.prompt.template for e in examples):
            t0 = time.time()
            group = [e for e in examples if e.prompt.template == template]
            ids = [e.prompt.id for e in group]
            sub = cells[(cells["direction"] == direction) & (cells["template"] == template)]
            estimates = _estimates(sub, column, config.units, model)
            whole_maps = [cell_map(e, slot_index, model) for e in group]
            maps = whole_maps if config.units == "cell" else [UnitCellMap(e, slot_index, model, list(estimates))
                                                               for e in group]
            entry = entries.get((direction, template))
            if entry is not None and config.metric != "logprob" and not entry.get("search_checked"):
                entry = None  # searched before shares were measured in the config's metric: again
            total = None
            if config.units != "cell":  # the donor's whole effect: every whole cell (the unit keys are a top few)
                total = SetVerifier(pairs[direction], [e.scored for e in group], whole_maps, pad_id, config.metric,
                                    config.exact_chunk).total
            if entry is None:
                result = minimal_graft_search(pairs[direction], [e.scored for e in group], maps, estimates, pad_id,
                                              settings.target_share, settings.max_cells, chunk=config.exact_chunk,
                                              metric=config.metric, total=total)
                entry = {"direction": direction, "template": template, "n_examples": len(group),
                         "search_checked": True, **result.to_json()}
                say(f"[{direction}/{template}] {len(result.cells)} cells carry {result.share:.0%} "
                    f"({'reached' if result.reached else 'NOT reached'})")
            verifier = SetVerifier(pairs[direction], [e.scored for e in group], maps, pad_id, config.metric,
                                   config.exact_chunk, entry["total_effect"])
            out["searches"].append(entry)
            found = _keys(entry["cells"])
            entry["received"] = received_summary(verifier, found, ids)
            if settings.refine and "refined" not in entry:
                tag = f"[{direction}/{template}]"
                entry["refined"] = refine_set(
                    verifier, found, entry["share"], settings.target_share, settings.refine_rounds,
                    lambda r, n, sh, tag=tag: say(f"{tag} refinement round {r}: {n} cells, share {sh:.0%}"))
                atomic.write_json(path, out)
                say(f"[{direction}/{template}] refined: {entry['size']} -> {entry['refined']['size']} cells, "
                    f"share {entry['refined']['share']:.0%}")
            if "refined" in entry:
                entry["refined"]["received"] = received_summary(verifier, _keys(entry["refined"]["cells"]), ids)
            if settings.controls and "controls" not in entry:
                entry["controls"] = set_controls(verifier, found, entry["share"], settings.controls, config.seed,
                                                 direction, template)
                if "refined" in entry:
                    r = entry["refined"]
                    r["controls"] = set_controls(verifier, _keys(r["cells"]), r["share"], settings.controls,
                                                 config.seed, direction, template)
                atomic.write_json(path, out)
                c = entry["controls"]
                say(f"[{direction}/{template}] controls: found {entry['share']:.0%} vs random mean "
                    f"{c['random']['mean']:.0%} / p95 {c['random']['p95']:.0%}, matched p95 {c['matched']['p95']:.0%}")
            if settings.missed_sample and "missed" not in entry:
                ranking = rank_keys(estimates, 1.0 if verifier.total > 0 else -1.0)
                entry["missed"] = missed_bound(verifier, ranking, entry["size"], settings.missed_sample,
                                               config.seed, direction, template)
                atomic.write_json(path, out)
            seconds[f"search_{direction}_{template}"] = time.time() - t0
            atomic.write_json(path, out)
    return out
