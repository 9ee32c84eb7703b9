"""``weightgraft plan``'s peak for a localize config against the peak resident memory of that
localize run, the plan's depth-shared states against what depth sharing held
(``DepthStats.peak_bytes``, the largest over every ``exact_effects`` call of the run), and the
plan's time by stage (attribution, exact cells, search, claims) against the run's own stage
times (``LocalizeResult.seconds``; loading the models is not a planned part on a CPU).

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/bench_plan_localize.py \\
        --config docs/localize/sets.yaml [key=value ...]

The run always starts afresh in a temporary directory (a resumed run would skip stages), with
the report off. The plan is made in this process just before the run, so its "process before
loading" is the same process's memory; the peak is sampled every millisecond (RSS, CPU runs).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak(fn: Any) -> tuple[int, Any]:
    """The process's peak RSS while ``fn()`` runs, and its result."""
    peak, stop = [_rss()], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        out = fn()
    finally:
        stop.set()
        thread.join()
    return max(peak[0], _rss()), out


def _recording_depth(calls: list[dict[str, int]]) -> Any:
    """``engine.cells``' depth_forward, recording each call's DepthStats."""
    import weightgraft.engine.cells as cells
    from weightgraft.engine.sharing.depth import DepthStats

    own = cells.depth_forward

    @functools.wraps(own)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        stats = kwargs.get("stats") or DepthStats()
        out = own(*args, **{**kwargs, "stats": stats})
        calls.append({"peak_bytes": stats.peak_bytes, "reference_bytes": stats.reference_bytes,
                      "items": len(args[1]), "largest_pass": max(stats.pass_sizes, default=0)})
        return out

    cells.depth_forward = recorded
    return own


def _stage(key: str) -> str | None:
    """The plan's part a stage time of the run belongs to (``estimates_sufficiency`` ->
    attribution; a model's stamp prefix is ignored)."""
    for prefix, part in (("estimates_", "attribution"), ("exact_", "exact cells"), ("search_", "search"),
                         ("claims", "claims")):
        if prefix in key:
            return part
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, required=True, help="a localize YAML")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, as weightgraft localize takes them")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from weightgraft.localization.config import load_localize_config
    from weightgraft.localization.run import plan_input, run_localize
    from weightgraft.planning.localize import DEPTH_STATES, EXACT_BATCH, plan_localize_work
    from weightgraft.planning.sizes import gib

    out = Path(tempfile.mkdtemp(prefix="bench_plan_localize_"))
    config = load_localize_config(args.config, [*args.overrides, f"out={out / 'run'}", "report=false"])
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    work = plan_input(config)
    plan = plan_localize_work(work, with_time=True)
    calls: list[dict[str, int]] = []
    own = _recording_depth(calls)
    t0 = time.time()
    try:
        measured, run = _peak(lambda: run_localize(config, progress=False))
    finally:
        import weightgraft.engine.cells as cells

        cells.depth_forward = own
    from weightgraft.models.spec import parse_spec
    from weightgraft.planning.depth_states import depth_state_bytes

    seq = plan.prompts["max_tokens"]
    states = depth_state_bytes(parse_spec(work.pre).footprint().config, work.exact_references, seq, work.exact_chunk,
                               8 if work.dtype == "float64" else 4)
    held = max((c["peak_bytes"] for c in calls), default=0)
    stages = {part: round(sum(v for k, v in run.seconds.items() if _stage(k) == part), 1) for part in plan.time_parts}
    timed = sum(stages.values())
    result = {
        "config": str(args.config), "overrides": args.overrides, "seconds": round(time.time() - t0, 1),
        "threads": args.threads, "prompts": plan.prompts, "batch_size": plan.batch_size,
        "plan_MiB": {k: round(v / 2**20, 1) for k, v in plan.memory.items()},
        "predicted_peak_MiB": round(plan.peak_bytes / 2**20, 1), "measured_peak_rss_MiB": round(measured / 2**20, 1),
        "predicted/measured": round(plan.peak_bytes / measured, 3),
        "time_s": {"planned": {k: round(v, 1) for k, v in plan.time_parts.items()}, "measured": stages,
                   "not planned": {k: round(v, 1) for k, v in run.seconds.items() if _stage(k) is None},
                   "planned/measured": round((plan.predicted_seconds or 0) / timed, 3) if timed else None},
        "depth": {"exact_effects_calls": len(calls), "reference_rows_planned": work.exact_references,
                  "predicted_states_MiB": round(states / 2**20, 2), "measured_states_MiB": round(held / 2**20, 2),
                  "predicted/measured": round(states / held, 3) if held else None,
                  "largest_call": max(calls, key=lambda c: c["peak_bytes"]) if calls else None},
    }
    print(json.dumps(result, indent=1))
    print(f"peak: predicted {gib(plan.peak_bytes)} ({EXACT_BATCH} {gib(plan.memory.get(EXACT_BATCH, 0))}, "
          f"{DEPTH_STATES} {gib(plan.memory.get(DEPTH_STATES, 0))}), measured {gib(measured)} RSS: "
          f"predicted/measured {plan.peak_bytes / measured:.3f}", file=sys.stderr)
    print(f"time: planned {plan.predicted_seconds or 0:.1f} s, measured {timed:.1f} s in the planned stages "
          f"({time.time() - t0:.1f} s with loading)", file=sys.stderr)


if __name__ == "__main__":
    main()
