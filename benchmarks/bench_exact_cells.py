"""Benchmark: exact single-cell effects (``engine.cells.exact_effects``), ms per cell, on any
model pair, split by where the cell sits (first vs last quarter of the layers).

Each cell is one slot at one position grafted from the donor into the base, its effect on the
answer's log-probability computed by an exact engine pass (no approximation). Prompts are
``--prompts`` runs of 10-25 random token ids (the paper's prompt lengths); the target is a
random token. The cells timed are a seeded uniform sample of every cell of those prompts
(``--cells`` per prompt, 0 = all), so the figure is the mean cost of a cell of a full map.

    python benchmarks/bench_exact_cells.py --model random:smollm2-135m --prompts 2 --cells 200
    python benchmarks/bench_exact_cells.py --model random:smollm2-135m --prompts 2 --cells 200 --sharing prefix
    python benchmarks/bench_exact_cells.py --model random:llama-3.2-1b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch

from weightgraft.engine.architectures import model_slots
from weightgraft.engine.cells import ScoredExample, exact_effects, example_cells
from weightgraft.models import load_model


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _examples(n: int, vocab: int, seed: int) -> list[ScoredExample]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(10, 26, (1,), generator=gen))
        ids = tuple(torch.randint(1, vocab, (length,), generator=gen).tolist())
        out.append(ScoredExample(ids, length - 1, int(torch.randint(1, vocab, (1,), generator=gen))))
    return out


def _layer(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="random:smollm2-135m", help="base model spec")
    ap.add_argument("--donor", default=None, help="donor spec (default: the base's spec @1 for random: models)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--cells", type=int, default=400, help="cells sampled per prompt (0: every cell)")
    ap.add_argument("--chunk", type=int, default=512, help="items per engine pass")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sharing", default="depth", choices=["prefix", "depth"],
                    help="exact_effects' path: prefix sharing, or depth sharing (each cell from its layer on); "
                         "half precision runs rows whole either way")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    donor_spec = args.donor or (f"{args.model}@1" if args.model.startswith("random:") and "@" not in args.model
                                else None)
    if donor_spec is None:
        raise SystemExit("give --donor")
    base = load_model(args.model, device=args.device, dtype=dtype).model
    donor = load_model(donor_spec, device=args.device, dtype=dtype).model
    models = [base, donor]
    names = [s.name for s in model_slots(base)]
    n_layers = base.config.num_hidden_layers
    quarter = max(1, n_layers // 4)
    examples = _examples(args.prompts, base.config.vocab_size, 0)
    gen = torch.Generator().manual_seed(1)
    sets = []
    for ex in examples:
        cells = example_cells(base, ex)
        if args.cells and len(cells) > args.cells:
            cells = [cells[i] for i in sorted(torch.randperm(len(cells), generator=gen)[: args.cells].tolist())]
        sets.append(cells)
    groups = {
        "all": lambda c: True,
        f"first quarter (layers 0-{quarter - 1})": lambda c: (_layer(names[c.slot]) is not None
                                                             and _layer(names[c.slot]) < quarter),
        f"last quarter (layers {n_layers - quarter}-{n_layers - 1})": lambda c: (
            _layer(names[c.slot]) is not None and _layer(names[c.slot]) >= n_layers - quarter),
    }
    print(f"model={args.model} donor={donor_spec} device={args.device} dtype={args.dtype} "
          f"threads={torch.get_num_threads()} sharing={args.sharing} layers={n_layers} prompts={len(examples)} "
          f"tokens/prompt={min(len(e.input_ids) for e in examples)}-{max(len(e.input_ids) for e in examples)}")
    with torch.no_grad():  # warm-up
        exact_effects(models, examples[:1], [[[c] for c in sets[0][:8]]], pad_id=0, chunk=args.chunk, share=args.sharing)
    for label, keep in groups.items():
        chosen = [[[c] for c in cells if keep(c)] for cells in sets]
        n = sum(len(s) for s in chosen)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        _sync(args.device)
        t0 = time.perf_counter()
        exact_effects(models, examples, chosen, pad_id=0, chunk=args.chunk, share=args.sharing)
        _sync(args.device)
        seconds = time.perf_counter() - t0
        peak = (f" peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated"
                if args.device.startswith("cuda") else "")
        print(f"{label:>36}: {n:6d} cells in {seconds:8.2f} s = {1000 * seconds / max(n, 1):8.2f} ms/cell{peak}",
              flush=True)


if __name__ == "__main__":
    main()
