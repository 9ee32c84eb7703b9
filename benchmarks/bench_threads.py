"""Threads on a busy machine: torch's default thread count against 1 thread and the default
weightgraft picks, while another process keeps one core busy.

Run alone (it starts its own competing process):
    python benchmarks/bench_threads.py [--seconds 8]
Each setting runs in a fresh subprocess (thread settings are fixed at torch start-up) and
times forward passes of a small random Llama (batch 8 x 64 tokens) for a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WORKLOAD = r"""
import json, os, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
if os.environ.get("BENCH_WEIGHTGRAFT_DEFAULT"):
    from weightgraft.runtime import apply_thread_default
    apply_thread_default()
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=8, vocab_size=8000)
model = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 8000, (8, 64))
with torch.no_grad():
    model(ids)
    times, end = [], time.time() + float(sys.argv[1])
    while time.time() < end or len(times) < 3:
        t = time.perf_counter(); model(ids); times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"threads": torch.get_num_threads(), "median_s": times[len(times) // 2], "n": len(times)}))
"""

BUSY = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def _measure(env_extra: dict[str, str], seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", WORKLOAD, str(seconds)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    settings = {
        "torch default": {},
        "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
        "default + OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
        "weightgraft default": {"BENCH_WEIGHTGRAFT_DEFAULT": "1", "OMP_WAIT_POLICY": "PASSIVE"},
    }
    print(f"cores available: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()[0]:.2f}")
    for busy in (False, True):
        competitor = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
        time.sleep(0.5 if busy else 0)
        try:
            for name, env in settings.items():
                r = _measure(env, args.seconds)
                print(f"{'busy' if busy else 'idle'}  {name:36s} threads={r['threads']:2d} "
                      f"median {r['median_s'] * 1000:8.1f} ms/forward  ({r['n']} forwards)", flush=True)
        finally:
            if competitor is not None:
                competitor.kill()
                competitor.wait()


if __name__ == "__main__":
    main()
