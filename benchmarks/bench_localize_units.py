"""Attribution of every cell at ``units: neuron`` (and ``head``) on the demo pair: SmolLM2-135M
(PRE) vs the cached demo finetune (SFT), the demo's 80 prompts (templates ``headline`` and
``qa``, direction a2b), one graft direction (sufficiency), beside plain cell-level attribution
in the same run. Target (issue 26): every neuron cell of 80 prompts in <= 5 minutes on 2 cores.

    OMP_NUM_THREADS=2 flock /tmp/heavy.lock .venv/bin/python benchmarks/bench_localize_units.py \
        --data runs/demo/data --sft /root/.cache/weightgraft/demo/sft-0adc0e62e8d0b485
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def _batches(examples, size: int):
    """Batches of examples sorted by length, padded as localize's estimate stage pads them."""
    from weightgraft.localization.maps import _batch

    ordered = sorted(examples, key=lambda e: e.scored.position)
    for start in range(0, len(ordered), size):
        chunk = ordered[start : start + size]
        ids, mask, pos, targets, _ = _batch(chunk)
        yield chunk, ids, mask, pos, targets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("runs/demo/data"))
    ap.add_argument("--sft", default="/root/.cache/weightgraft/demo/sft-0adc0e62e8d0b485")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from weightgraft.data.prompts import load_test_prompts
    from weightgraft.engine.attribution import graft_attribution, graft_unit_attribution
    from weightgraft.engine.partial import PartialGraft
    from weightgraft.localization.examples import build_examples
    from weightgraft.models import load_model

    pre, sft = load_model("smollm2-135m"), load_model(args.sft)
    prompts = [p for p in load_test_prompts(args.data) if p.template in ("headline", "qa") and p.direction == "a2b"]
    examples, excluded = build_examples(prompts, pre.tokenizer)
    examples = examples[: args.limit] if args.limit else examples
    pair = PartialGraft(pre.model, sft.model)
    positions = sum(e.scored.position + 1 for e in examples)
    print(f"prompts: {len(examples)} ({len(excluded)} excluded), {positions} positions; threads {args.threads}; "
          f"torch {torch.__version__}")
    times, counts = {}, {}
    for units in ("cell", "head", "neuron", "cell"):  # cell twice: before and after, for the machine's drift
        t0 = time.time()
        n = 0
        for chunk, ids, mask, pos, targets in _batches(examples, args.batch):
            if units == "cell":
                g = graft_attribution(pair, ids, pos, targets=targets, attention_mask=mask)
                n += sum((e.scored.position + 1) * g.shape[-1] for e in chunk)
            else:
                g, per_unit = graft_unit_attribution(pair, ids, pos, targets=targets, kind=units, attention_mask=mask)
                width = g.shape[-1] - len(per_unit) + sum(u.shape[-1] for u in per_unit.values())
                n += sum((e.scored.position + 1) * width for e in chunk)
        key = units if units not in times else "cell (again)"
        times[key], counts[key] = time.time() - t0, n
        print(f"attribution, units: {units}: {times[key]:.1f}s for {n:,} estimates (position x slot-or-unit)", flush=True)
    from weightgraft.localization.maps import estimate_frame

    for units in ("cell", "neuron"):  # localize's estimate stage: the same passes plus the table rows
        t0 = time.time()
        frame = estimate_frame(pair, examples, "sufficiency", metric="logprob", batch_size=args.batch, units=units)
        print(f"localize estimate stage (estimate_frame), units: {units}: {time.time() - t0:.1f}s, {len(frame):,} rows",
              flush=True)
    cell = min(times["cell"], times["cell (again)"])
    for units in ("head", "neuron"):
        print(f"{units}: {times[units]:.1f}s = {times[units] / cell:.2f}x plain cell attribution "
              f"({counts[units] / counts['cell']:.0f}x the estimates)")
    print(f"target: neuron <= 300 s: {'met' if times['neuron'] <= 300 else 'NOT met'}")


if __name__ == "__main__":
    main()
