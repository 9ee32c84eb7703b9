"""Exact effects on the demo pair, prefix sharing vs depth sharing on the same cells, side by side
(``bench_localize.py --depth``): single cells by layer quarter, then rounds of the refinement
of docs/localize/sets.yaml's two found sets."""

from __future__ import annotations

import functools
import json
import random
import resource
import shutil
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


def single_cells(models: list, examples: list, n_cells: int, seed: int = 0) -> list[dict[str, Any]]:
    """Seconds per path for the same sampled single cells, one exact_effects call per bucket."""
    from weightgraft.engine.cells import example_cells, exact_effects
    from weightgraft.engine.depth import DepthStats, depth_state_bytes
    from weightgraft.engine.forward import slots

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
        for path in PATHS:
            stats = DepthStats()
            t0 = time.perf_counter()
            _, effects[path] = exact_effects(models, examples, sets, pad_id=0, share=path, stats=stats)
            row[f"{path}_s"] = time.perf_counter() - t0
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
    """The sets.yaml run's found sets (search only), then ``--refine-rounds`` refinement rounds
    of both sets by each path from the same found sets; seconds of the search stages that hold
    the refinement."""
    import weightgraft.localize.verify as verify
    from weightgraft.engine.cells import exact_effects
    from weightgraft.localize import localize
    from weightgraft.localize.config import parse_localize_config

    raw = yaml.safe_load((ROOT / "docs/localize/sets.yaml").read_text())
    raw.update(data=str(args.data), out=str(args.out / "sets"))
    raw["models"]["sft"] = str(sft_dir)
    raw["search"].update(refine=False, controls=0, missed_sample=0)

    def load(spec: str, _dtype: torch.dtype) -> Any:
        return loaded[spec]

    t0 = time.perf_counter()
    found = localize(parse_localize_config(raw), progress=True, load=load)
    out = {"search_s": time.perf_counter() - t0}
    search = Path(found.run_dir) / "search.json"
    saved = search.with_suffix(".found.json")
    shutil.copy(search, saved)
    raw["search"].update(refine=True, refine_rounds=args.refine_rounds)
    for path in PATHS:
        shutil.copy(saved, search)
        verify.exact_effects = functools.partial(exact_effects, share=path)
        try:
            result = localize(parse_localize_config(raw), progress=True, load=load)
        finally:
            verify.exact_effects = exact_effects
        entries = json.loads(search.read_text())["searches"]
        out[path] = {
            "seconds": {k: v for k, v in result.seconds.items() if k.startswith("search_")},
            "sets": [{"template": e["template"], "found": e["size"], "found_share": e["share"],
                      "refined": e["refined"]["size"], "share": e["refined"]["share"],
                      "rounds": e["refined"]["rounds"]} for e in entries],
        }
    return out


def depth_mode(args: Any, sft_dir: Path) -> None:
    from weightgraft.data.prompts import load_test_prompts
    from weightgraft.localize.examples import build_examples
    from weightgraft.models import load_model

    pre, sft = load_model("smollm2-135m"), load_model(str(sft_dir))
    loaded = {"smollm2-135m": pre, str(sft_dir): sft}
    prompts = [p for p in load_test_prompts(args.data) if p.template in ("headline", "qa") and p.direction == "a2b"]
    examples, _ = build_examples(prompts, pre.tokenizer)
    first = [next(e for e in examples if e.prompt.template == t).scored for t in ("headline", "qa")]
    print(f"threads {torch.get_num_threads()}; prompts: headline and qa r0 ({[e.position + 1 for e in first]} tokens); "
          f"{args.cells} sampled cells per prompt (seed 0); sufficiency (SFT cells into PRE); float32")
    report: dict[str, Any] = {}
    if not args.skip_cells:
        rows = single_cells([pre.model, sft.model], first, args.cells)
        _print_cells(rows)
        print(f"predicted peak of the shared states (depth_state_bytes, chunk 512): "
              f"{rows[0]['predicted_state_mib']:.1f} MiB")
        report["single_cells"] = rows
    if not args.skip_refine:
        ref = refinement(args, sft_dir, loaded)
        report["refinement"] = ref
        print(f"found sets (search, exact verification by depth sharing): {ref['search_s']:.0f}s")
        for path in PATHS:
            secs = sum(ref[path]["seconds"].values())
            sets = ", ".join(f"{s['template']} {s['found']} -> {s['refined']} cells ({s['share']:.1%}, "
                             f"{s['rounds']} round(s))" for s in ref[path]["sets"])
            print(f"refinement, {args.refine_rounds} round(s) per set, {path} sharing: {secs:.0f}s; {sets}")
        p, d = (sum(ref[x]["seconds"].values()) for x in PATHS)
        print(f"refinement speedup (depth vs prefix): {p / d:.2f}x")
    report["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the process: {report['max_rss_mib']:.0f} MiB")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "bench_depth_cells.json" if args.skip_refine else "bench_depth.json"
    (args.out / name).write_text(json.dumps(report, indent=2))
