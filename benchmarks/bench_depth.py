"""Exact effects on the demo pair, prefix sharing vs depth sharing on the same cells, side by side
(``bench_localize.py --depth``): single cells by layer quarter, then a sample of a refinement
round of docs/localize/sets.yaml's two found sets (the set without each sampled cell)."""

from __future__ import annotations

import functools
import json
import random
import resource
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("prefix", "depth")


def _bucket(name: str, n_layers: int) -> str:
    if not name.startswith("layers."):
        return "embed / final_norm / unembed"
    quarter = 4 * int(name.split(".")[1]) // n_layers
    return f"layers, quarter {quarter + 1}"


def single_cells(models: list, examples: list, n_cells: int, seed: int = 0, reps: int = 2) -> list[dict[str, Any]]:
    """Seconds per path for the same sampled single cells, one exact_effects call per bucket and
    repetition (the fastest repetition of each path)."""
    from weightgraft.engine.cells import exact_effects, example_cells
    from weightgraft.engine.forward import slots
    from weightgraft.engine.sharing.depth import DepthStats
    from weightgraft.planning.depth_states import depth_state_bytes

    names = slots(models[0])
    n_layers = models[0].config.num_hidden_layers
    rng = random.Random(seed)
    sampled = []
    for ex in examples:
        cells = example_cells(models[0], ex)
        sampled.append(rng.sample(cells, min(n_cells, len(cells))))
    buckets = sorted({_bucket(names[c.slot], n_layers) for cells in sampled for c in cells})
    rows = []
    for bucket in buckets:
        sets = [[[c] for c in cells if _bucket(names[c.slot], n_layers) == bucket] for cells in sampled]
        row: dict[str, Any] = {"cells": bucket, "n": sum(len(s) for s in sets)}
        effects = {}
        # the two paths alternate, `reps` times each, and the fastest of each counts: a burst of
        # other load on the machine then slows one repetition, not one path
        for _ in range(reps):
            for path in PATHS:
                stats = DepthStats()
                t0 = time.perf_counter()
                _, effects[path] = exact_effects(models, examples, sets, pad_id=0, share=path, stats=stats)
                seconds = time.perf_counter() - t0
                row[f"{path}_s"] = min(seconds, row.get(f"{path}_s", seconds))
                if path == "depth":
                    row["peak_state_mib"] = stats.peak_bytes / 2**20
                    row["passes"] = stats.passes
        row["max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(effects["prefix"], effects["depth"]) if len(a))
        rows.append(row)
    longest = max(len(ex.input_ids[: ex.position + 1]) for ex in examples)
    predicted = depth_state_bytes(models[0].config, 2 * len(examples), longest, 512) / 2**20
    for row in rows:
        row["predicted_state_mib"] = predicted
    return rows


def _print_cells(rows: list[dict[str, Any]]) -> None:
    print(f"{'cells':32s} {'n':>6s} {'prefix ms/cell':>15s} {'depth ms/cell':>14s} {'speedup':>8s} "
          f"{'max |Δ effect|':>15s} {'peak states MiB':>16s}")
    for row in rows + [_total(rows)]:
        print(f"{row['cells']:32s} {row['n']:6d} {1e3 * row['prefix_s'] / row['n']:15.1f} "
              f"{1e3 * row['depth_s'] / row['n']:14.1f} {row['prefix_s'] / row['depth_s']:7.2f}x "
              f"{row['max_abs_diff']:15.2e} {row['peak_state_mib']:16.1f}")


def _total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"cells": "all", "n": sum(r["n"] for r in rows), "prefix_s": sum(r["prefix_s"] for r in rows),
            "depth_s": sum(r["depth_s"] for r in rows), "max_abs_diff": max(r["max_abs_diff"] for r in rows),
            "peak_state_mib": max(r["peak_state_mib"] for r in rows)}


def refinement(args: Any, sft_dir: Path, loaded: dict[str, Any]) -> dict[str, Any]:
    """The sets.yaml run's found sets (search only, its exact verification by depth sharing),
    then, per set and path, the main call of a refinement round: the set without each of
    ``--refine-cells`` of its cells (seeded sample) over the template's prompts, one
    ``SetVerifier.shares`` call; a whole round is that call for every cell of the set."""
    import weightgraft.localization.verify as verify
    from weightgraft.engine.architectures import model_slots
    from weightgraft.engine.cells import exact_effects
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.examples import build_examples
    from weightgraft.localization.maps import cell_map
    from weightgraft.localization.prompts import select_prompts
    from weightgraft.localization.run import run_localize

    raw = yaml.safe_load((ROOT / "docs/localize/sets.yaml").read_text())
    raw.update(data=str(args.data), out=str(args.out / "sets"))
    raw["models"]["sft"] = str(sft_dir)
    raw["search"].update(refine=False, controls=0, missed_sample=0)
    config = parse_localize_config(raw)

    def load(spec: str, _dtype: torch.dtype) -> Any:
        return loaded[spec]

    t0 = time.perf_counter()
    found = run_localize(config, progress=False, load=load)
    out: dict[str, Any] = {"search_s": time.perf_counter() - t0, "sets": []}
    pre, sft = loaded["smollm2-135m"], loaded[str(sft_dir)]
    examples, _ = build_examples(select_prompts(config), pre.tokenizer)
    slot_index = {s.name: i for i, s in enumerate(model_slots(pre.model))}
    pad_id = pre.tokenizer.pad_token_id if pre.tokenizer.pad_token_id is not None else 0
    rng = random.Random(0)
    for entry in found.search["searches"]:
        fit = set(entry.get("fit_ids") or [e.prompt.id for e in examples])  # refinement sees the fit prompts only
        group = [e for e in examples if e.prompt.template == entry["template"] and e.prompt.id in fit]
        maps = [cell_map(e, slot_index, pre.model) for e in group]
        verifier = verify.SetVerifier([pre.model, sft.model], [e.scored for e in group], maps, pad_id, config.metric,
                                      config.exact_chunk, entry["total_effect"])
        keys = [(c["position_label"], c["slot"]) for c in entry["cells"]]
        dropped = rng.sample(range(len(keys)), min(args.refine_cells, len(keys)))
        sets = [keys[:i] + keys[i + 1 :] for i in dropped]
        row: dict[str, Any] = {"template": entry["template"], "set_size": len(keys), "share": entry["share"],
                               "sampled": len(sets), "prompts": len(group)}
        shares = {}
        for path in PATHS:
            verify.exact_effects = functools.partial(exact_effects, share=path)
            try:
                t0 = time.perf_counter()
                shares[path] = verifier.shares(sets)
                row[f"{path}_s"] = time.perf_counter() - t0
            finally:
                verify.exact_effects = exact_effects
        row["max_abs_diff_share"] = max(abs(a - b) for a, b in zip(shares["prefix"], shares["depth"]))
        out["sets"].append(row)
    return out


def depth_mode(args: Any, sft_dir: Path) -> None:
    from weightgraft.data.prompts import load_test_prompts
    from weightgraft.localization.examples import build_examples
    from weightgraft.models import load_model

    pre, sft = load_model("smollm2-135m"), load_model(str(sft_dir))
    loaded = {"smollm2-135m": pre, str(sft_dir): sft}
    prompts = [p for p in load_test_prompts(args.data) if p.template in ("headline", "qa") and p.direction == "a2b"]
    examples, _ = build_examples(prompts, pre.tokenizer)
    first = [next(e for e in examples if e.prompt.template == t).scored for t in ("headline", "qa")]
    print(f"threads {torch.get_num_threads()}; prompts: headline and qa r0 ({[e.position + 1 for e in first]} tokens); "
          f"{args.cells} sampled cells per prompt (seed 0); sufficiency (SFT cells into PRE); float32; "
          f"fastest of {args.reps} alternating repetitions per path")
    report: dict[str, Any] = {}
    if not args.skip_cells:
        rows = single_cells([pre.model, sft.model], first, args.cells, reps=args.reps)
        _print_cells(rows)
        print(f"predicted peak of the shared states (depth_state_bytes, chunk 512): "
              f"{rows[0]['predicted_state_mib']:.1f} MiB")
        report["single_cells"] = rows
    if not args.skip_refine:
        ref = refinement(args, sft_dir, loaded)
        report["refinement"] = ref
        print(f"found sets (search, exact verification by depth sharing): {ref['search_s']:.0f}s")
        for r in ref["sets"]:
            per = {p: r[f"{p}_s"] / r["sampled"] for p in PATHS}
            print(f"refinement of {r['template']} ({r['set_size']} cells, share {r['share']:.1%}, {r['prompts']} prompts): "
                  f"the set without each of {r['sampled']} sampled cells: prefix {r['prefix_s']:.1f}s, depth "
                  f"{r['depth_s']:.1f}s ({r['prefix_s'] / r['depth_s']:.2f}x; max |Δ share| {r['max_abs_diff_share']:.1e}); "
                  f"a round (every cell) extrapolated: prefix {per['prefix'] * r['set_size']:.0f}s, "
                  f"depth {per['depth'] * r['set_size']:.0f}s")
        p, d = (sum(r[f"{x}_s"] for r in ref["sets"]) for x in PATHS)
        print(f"refinement speedup, both sets (depth vs prefix): {p / d:.2f}x")
    report["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the process: {report['max_rss_mib']:.0f} MiB")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "bench_depth_cells.json" if args.skip_refine else "bench_depth.json"
    (args.out / name).write_text(json.dumps(report, indent=2))
