"""Cell maps on the demo pair (SmolLM2-135M vs the demo finetune): time and quality of
attribution (gradient, integrated gradients) vs exhaustive exact cells vs the per-token
definition, and the minimal graft sets.

Run after ``weightgraft demo`` (it builds the data and caches the finetune), under the lock:

    OMP_NUM_THREADS=2 PYTHONPATH=src flock /tmp/heavy.lock python benchmarks/bench_localize.py \
        --data /tmp/demo_run/data --out /tmp/bench_localize

Exhaustive exact maps of all 80 prompts take hours on 2 CPU cores: they are measured on the
first ``--exact`` prompts of each template and extrapolated per cell (said so in the output).

``--depth`` runs only the comparison of the two exact paths, prefix sharing and depth sharing,
side by side on the same cells (``bench_depth.depth_mode``): single cells by layer quarter, and
a sample of a refinement round of docs/localize/sets.yaml's found sets.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch


def _sft_dir(data: Path) -> Path:
    from weightgraft.demo import _sft_cache_dir

    path = _sft_cache_dir(data, "cpu-quick", "a2b", 0)
    if not (path / "training_manifest.json").is_file():
        raise SystemExit(f"no demo finetune at {path}: run `weightgraft demo` first")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/tmp/demo_run/data"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_localize"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact", type=int, default=2, help="prompts per template with exhaustive exact maps")
    ap.add_argument("--ig-steps", type=int, default=4)
    ap.add_argument("--per-token-sample", type=int, default=12)
    ap.add_argument("--depth", action="store_true", help="only prefix vs depth sharing (see depth_mode)")
    ap.add_argument("--cells", type=int, default=1500, help="--depth: cells sampled per prompt (seeded)")
    ap.add_argument("--refine-cells", type=int, default=48, help="--depth: cells of a set timed per refinement round")
    ap.add_argument("--reps", type=int, default=2, help="--depth: alternating repetitions per path (fastest counts)")
    ap.add_argument("--skip-refine", action="store_true", help="--depth: single cells only")
    ap.add_argument("--skip-cells", action="store_true", help="--depth: refinement only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.depth:
        from bench_depth import depth_mode

        depth_mode(args, _sft_dir(args.data))
        return
    from weightgraft.api.localize import localize
    from weightgraft.data.prompts import load_test_prompts
    from weightgraft.engine.attribution import graft_attribution
    from weightgraft.engine.cells import exact_effects, example_cells
    from weightgraft.engine.partial import PartialGraft
    from weightgraft.engine.reference import CompositeModel, per_token_forward
    from weightgraft.localization.agreement import agreement
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.examples import build_examples
    from weightgraft.localization.maps import estimate_frame
    from weightgraft.models import load_model

    sft_dir = _sft_dir(args.data)
    pre, sft = load_model("smollm2-135m"), load_model(str(sft_dir))
    prompts = [p for p in load_test_prompts(args.data) if p.template in ("headline", "qa") and p.direction == "a2b"]
    examples, excluded = build_examples(prompts, pre.tokenizer)
    n_cells = sum(len(example_cells(pre.model, e.scored)) for e in examples)
    print(f"prompts: {len(examples)} ({len(excluded)} excluded); cells per direction: {n_cells}; threads {args.threads}")
    pair = PartialGraft(pre.model, sft.model)

    # 1. attribution map of every cell, both directions
    t0 = time.time()
    maps = {d: estimate_frame(p, examples, d, metric="logprob", batch_size=16) for d, p in (("sufficiency", pair), ("necessity", pair.swapped()))}
    t_grad = time.time() - t0
    print(f"attribution (gradient), every cell, both directions: {t_grad:.1f}s  [target < 60 s] "
          f"({sum(len(m) for m in maps.values())} rows)")
    t0 = time.time()
    for p in (pair, pair.swapped()):
        for start in range(0, len(examples), 16):
            chunk = sorted(examples, key=lambda e: e.scored.position)[start : start + 16]
            n = max(e.scored.position + 1 for e in chunk)
            ids = torch.zeros(len(chunk), n, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, e in enumerate(chunk):
                ids[i, : e.scored.position + 1] = torch.tensor(e.scored.input_ids)
                mask[i, : e.scored.position + 1] = 1
            graft_attribution(p, ids, torch.tensor([e.scored.position for e in chunk]),
                              targets=torch.tensor([e.scored.target for e in chunk]), attention_mask=mask, steps=args.ig_steps)
    t_ig = time.time() - t0
    print(f"integrated gradients ({args.ig_steps} steps), every cell, both directions: {t_ig:.1f}s")

    # 2. the localize pipeline: exact maps on a subset, search, report
    raw = {"name": "demo", "data": str(args.data), "models": {"pre": "smollm2-135m", "sft": str(sft_dir)},
           "templates": ["headline", "qa"], "directions": ["a2b"], "ig_steps": args.ig_steps,
           "exact": args.exact, "out": str(args.out / "demo")}
    t0 = time.time()
    result = localize(parse_localize_config(raw), progress=True)
    print(f"localize run: {time.time() - t0:.0f}s; stages: " + ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items()))
    cells = result.cells
    exact_cells = int(cells["exact"].notna().sum())
    t_exact = sum(v for k, v in result.seconds.items() if k.startswith("exact_"))
    per_cell = t_exact / exact_cells
    print(f"exact single cells (depth sharing): {exact_cells} cells in {t_exact:.0f}s = {1e3 * per_cell:.1f} ms/cell; "
          f"every cell of both directions extrapolated: {per_cell * 2 * n_cells / 60:.0f} min")

    # 3. what depth sharing saves, on a sample of one prompt's cells
    ex = examples[0]
    rng = random.Random(0)
    sample = rng.sample(example_cells(pre.model, ex.scored), 300)
    times = {}
    for share in (True, False):
        t0 = time.time()
        exact_effects([pre.model, sft.model], [ex.scored], [[[c] for c in sample]], pad_id=0, share=share)
        times[share] = time.time() - t0
    print(f"300 cells of one prompt: depth sharing {times[True]:.1f}s, whole rows {times[False]:.1f}s "
          f"({times[False] / times[True]:.2f}x)")

    # 4. the per-token definition, one cell at a time (a timed sample)
    composite = CompositeModel([pre.model, sft.model])
    n_slots = len(pair.slots)
    picks = rng.sample(example_cells(pre.model, ex.scored), args.per_token_sample)
    t0 = time.time()
    for c in picks:
        source = torch.zeros(1, ex.scored.position + 1, n_slots, dtype=torch.long)
        source[0, c.position, c.slot] = 1
        per_token_forward([pre.model, sft.model], torch.tensor([ex.scored.input_ids]), source, composite=composite)
    pt_cell = (time.time() - t0) / len(picks)
    t_pt = pt_cell * 2 * n_cells
    print(f"per-token definition: {pt_cell:.2f} s/cell; every cell of both directions extrapolated: {t_pt / 3600:.1f} h")
    print(f"ratios (every cell, both directions): per-token / gradient {t_pt / t_grad:.0f}x; "
          f"exact (engine) / gradient {per_cell * 2 * n_cells / t_grad:.0f}x; per-token / exact {pt_cell / per_cell:.0f}x; "
          f"IG{args.ig_steps} / gradient {t_ig / t_grad:.1f}x")

    # 5. agreement and minimal sets
    n_layers = int(cells["layer"].max()) + 1
    table = agreement(cells, n_layers)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for entry in result.search.get("searches", []):
        top = ", ".join(f"{c['position_label']}:{c['slot']}" for c in entry["cells"][:12])
        print(f"minimal set {entry['direction']}/{entry['template']} ({entry['n_examples']} prompts): {entry['size']} cells "
              f"carry {entry['share']:.1%} (target {entry['target_share']:.0%}, {'met' if entry['reached'] else 'NOT met'}); "
              f"first: {top}")
    (args.out / "bench.json").write_text(json.dumps({
        "t_grad": t_grad, "t_ig": t_ig, "exact_ms_per_cell": 1e3 * per_cell, "per_token_s_per_cell": pt_cell,
        "n_cells_per_direction": n_cells, "agreement": table.to_dict(orient="records"),
        "prefix_sharing": {"shared_s": times[True], "whole_s": times[False]},
    }, indent=2))


if __name__ == "__main__":
    main()
