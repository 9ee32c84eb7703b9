"""The localize plan's ``units: head | neuron`` terms against the measured peak of localize's
estimate stage (``estimate_frame``: every cell's and unit's attribution, the unit rows kept)
at ``units`` cell, neuron and head, on one model pair and the first prompts of a dataset.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_plan_units.py \\
        --pre PRE_DIR --sft SFT_DIR --data runs/demo/data --limit 4

Measured: the peak resident memory above the level before the stage (sampled every ms), against
the plan's attribution batch (with the unit shares), unit rows and cell tables; results in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import threading
import time


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_extra(fn):
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    base = _rss()
    peak, stop = [base], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample)
    thread.start()
    out = fn()
    stop.set()
    thread.join()
    return max(peak[0], _rss()) - base, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pre", required=True)
    ap.add_argument("--sft", required=True)
    ap.add_argument("--data", default="runs/demo/data")
    ap.add_argument("--limit", type=int, default=4, help="prompts per template (headline, qa)")
    args = ap.parse_args()
    from weightgraft.engine.architectures import Units
    from weightgraft.engine.partial import PartialGraft
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.localization.examples import build_examples
    from weightgraft.localization.maps import estimate_frame
    from weightgraft.localization.prompts import select_prompts
    from weightgraft.localization.run import plan_input
    from weightgraft.models import load_model
    from weightgraft.planning.localize import plan_localize_work

    pre, sft = load_model(args.pre), load_model(args.sft)
    pair = PartialGraft(pre.model, sft.model)
    raw = {"data": args.data, "models": {"pre": args.pre, "sft": args.sft}, "templates": ["headline", "qa"],
           "limit": args.limit, "graft_directions": ["sufficiency"], "exact": "none"}
    warm, _ = build_examples(select_prompts(parse_localize_config(raw)), pre.tokenizer)
    estimate_frame(pair, warm[:2], "sufficiency", metric="logprob", batch_size=2, ig_steps=0, units=Units.NEURON, unit_rows=20000)  # warm-up
    for units in (Units.CELL, Units.NEURON, Units.HEAD):
        config = parse_localize_config({**raw, "units": units.value})
        plan = plan_localize_work(plan_input(config), memory="1TiB", with_time=False)
        examples, _ = build_examples(select_prompts(config), pre.tokenizer)
        measured, frame = _peak_extra(lambda examples=examples, plan=plan, units=units, config=config: estimate_frame(
            pair, examples, "sufficiency", metric="first_logprob", batch_size=plan.batch_size, ig_steps=0, units=units, unit_rows=config.unit_rows))
        parts = {k: plan.memory.get(k, 0) for k in ("batch (attribution or exact cells)", "unit rows", "cell tables")}
        predicted = sum(parts.values())
        print(json.dumps({"units": str(units), "prompts": len(examples), "batch": plan.batch_size, "rows": len(frame),
                          "measured_MiB": measured >> 20, "predicted_MiB": predicted >> 20,
                          **{f"{k}_MiB": v >> 20 for k, v in parts.items()}, "predicted/measured": round(predicted / measured, 2)}))
        del frame


if __name__ == "__main__":
    main()
