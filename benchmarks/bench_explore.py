"""Latency of ``weightgraft explore``'s ``POST /api/graft`` on SmolLM2-135M, CPU, over real HTTP
(uvicorn in a thread, an HTTP client in the main thread): what a researcher waits for after each
painted stroke (PRE and SFT cached for the prompt: one grafted row) and after a stroke painted
late in the prompt and high in the model (the FFN of 4 layers at one token: it resumes from the
prompt's kept states), after a new prompt (the grafted, PRE and SFT rows in one pass), and after
a localize set of heads and neurons is applied
(20 heads and 20 neurons, each slot grafted unit by unit). Prompts: the README's two (8 and 22
tokens), taken in turn; each stroke paints a fresh random set of cells.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_explore.py [--sft DIR] [--n 40]

The donor is the demo finetune when ``weightgraft demo`` has cached one (``--sft`` names another),
else SmolLM2 with every weight moved by noise (the latency does not depend on what the weights are).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from pathlib import Path

PROMPTS = ["Keanu Reeves starred in a movie with",
           "Q: Who starred in a movie alongside Meryl Streep? A: An actor named"]


def _donor(pre, spec: str | None):
    import copy

    import torch

    from weightgraft.models import load_model

    if spec is None:
        found = sorted(p for p in Path("~/.cache/weightgraft/demo").expanduser().glob("sft-*") if (p / "config.json").is_file())
        spec = str(found[0]) if found else None
    if spec is not None:
        return load_model(spec).model, spec
    donor = copy.deepcopy(pre)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in donor.parameters():
            p.add_(0.01 * p.std() * torch.randn(p.shape, generator=gen))
    return donor, "smollm2-135m + noise"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft", default=None)
    ap.add_argument("--n", type=int, default=40, help="requests per measurement")
    args = ap.parse_args()

    import httpx2 as httpx
    import torch
    import uvicorn

    from weightgraft.explore.app import create_app
    from weightgraft.explore.serve import free_port
    from weightgraft.explore.session import Explorer
    from weightgraft.models import load_model

    pre = load_model("smollm2-135m")
    sft, sft_name = _donor(pre.model, args.sft)
    explorer = Explorer({"pre": pre.model, "sft": sft}, pre.tokenizer)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(explorer, address=("127.0.0.1", port)), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/api/graft"
    slots = explorer.slot_names
    rng = random.Random(0)
    client = httpx.Client(timeout=60)
    lengths = [len(pre.tokenizer(p)["input_ids"]) for p in PROMPTS]

    def stroke(prompt: str, n_tokens: int) -> dict:
        cells = [{"position": rng.randrange(n_tokens), "slot": rng.choice(slots), "model": "sft"} for _ in range(40)]
        return {"prompt": prompt, "cells": cells, "answer": "Tom Hanks", "k": 10}

    split = [(s.name, "h" if s.heads else "n", s.units(s.unit_kind())) for s in explorer.slot_list if s.unit_kind()]
    heads, neurons = [x for x in split if x[1] == "h"], [x for x in split if x[1] == "n"]

    def late_stroke(prompt: str, n_tokens: int) -> dict:  # FFN of 4 layers from 15-29 at one of the last 2 tokens
        first, position = rng.randrange(15, 27), n_tokens - 1 - rng.randrange(2)
        cells = [{"position": position, "slot": f"layers.{j}.{c}", "model": "sft"}
                 for j in range(first, first + 4) for c in ("gate", "up", "down")]
        return {"prompt": prompt, "cells": cells, "answer": "Tom Hanks", "k": 10}

    def unit_stroke(prompt: str, n_tokens: int) -> dict:
        cells = [{"position": rng.randrange(n_tokens), "slot": f"{name}/{letter}{rng.randrange(n)}", "model": "sft"}
                 for name, letter, n in [rng.choice(heads) for _ in range(20)] + [rng.choice(neurons) for _ in range(20)]]
        return {"prompt": prompt, "cells": cells, "answer": "Tom Hanks", "k": 10}

    def timed(body: dict) -> float:
        t0 = time.perf_counter()
        res = client.post(url, json=body)
        ms = 1000 * (time.perf_counter() - t0)
        res.raise_for_status()
        return ms

    for i in range(4):  # warm-up: first passes allocate
        timed(stroke(PROMPTS[i % 2], lengths[i % 2]))
    paint = [timed(stroke(PROMPTS[i % 2], lengths[i % 2])) for i in range(args.n)]
    late = [timed(late_stroke(PROMPTS[i % 2], lengths[i % 2])) for i in range(args.n)]
    units = [timed(unit_stroke(PROMPTS[i % 2], lengths[i % 2])) for i in range(args.n)]
    fresh = []
    for i in range(args.n):  # a new prompt each time: PRE and SFT are not cached
        explorer.passes.cache.clear()
        fresh.append(timed(stroke(PROMPTS[i % 2], lengths[i % 2])))
    bursts = [burst(url, [stroke(PROMPTS[0], lengths[0]) for _ in range(30)]) for _ in range(5)]
    server.should_exit = True
    print(f"SmolLM2-135M (pre) vs {sft_name} (sft), float32, CPU, torch threads {torch.get_num_threads()} "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); prompts of {lengths} tokens in turn, "
          f"40 random cells painted per request, {args.n} requests each")
    for name, values in (("painted stroke (PRE/SFT cached, 1 grafted row)", paint),
                         ("stroke of 4 layers' FFN at one of the last 2 tokens (PRE/SFT cached)", late),
                         ("new prompt (grafted + PRE + SFT rows, one pass)", fresh),
                         ("set of 20 heads + 20 neurons (PRE/SFT cached, 1 grafted row by unit)", units)):
        q = statistics.quantiles(values, n=10)
        print(f"  {name}: median {statistics.median(values):.1f} ms, p10 {q[0]:.1f}, p90 {q[-1]:.1f}")
    last = [b["last_ms"] for b in bursts]
    print(f"  30 concurrent strokes from one page (5 bursts): the last stroke answered median "
          f"{statistics.median(last):.1f} ms after it was sent (max {max(last):.1f}) = "
          f"{statistics.median(last) / statistics.median(paint):.2f}x a single stroke; "
          f"{statistics.median(b['from_start_ms'] for b in bursts):.1f} ms after the burst began (30 clients set "
          f"up in this process); answered per burst: {bursts[-1]['codes']}")
    print(f"median_graft_ms={statistics.median(paint):.1f} target<=150; "
          f"median_new_prompt_ms={statistics.median(fresh):.1f} target<=400; "
          f"median_late_stroke_ms={statistics.median(late):.1f}; "
          f"median_unit_set_ms={statistics.median(units):.1f} (ratio to a stroke {statistics.median(units) / statistics.median(paint):.2f}); "
          f"burst_last_over_single={statistics.median(last) / statistics.median(paint):.2f} target<=2")


def burst(url: str, bodies: list[dict]) -> dict:
    """Send ``bodies`` at once as strokes 1..n of one page (as a researcher dragging the mouse
    makes them); the time until the last stroke's answer, and how each was answered."""
    import httpx2 as httpx

    page = f"bench-{random.random():.9f}"
    codes: dict[int, int] = {}
    done: dict[int, float] = {}
    t0 = time.perf_counter()

    sent: dict[int, float] = {}

    def send(i: int, body: dict) -> None:
        with httpx.Client(timeout=120) as c:
            request = c.build_request("POST", url, json={**body, "page": page, "seq": i})
            sent[i] = time.perf_counter()
            codes[i] = c.send(request).status_code
        done[i] = time.perf_counter()

    threads = [threading.Thread(target=send, args=(i + 1, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = len(bodies)
    if codes[n] != 200:
        raise RuntimeError(f"the last stroke was answered {codes[n]}")
    summary = {c: sum(1 for v in codes.values() if v == c) for c in sorted(set(codes.values()))}
    # from the last stroke's own send (the researcher's last mouse move) to its answer; and from
    # the burst's start, which also counts the 30 clients this process sets up
    return {"last_ms": 1000 * (done[n] - sent[n]), "from_start_ms": 1000 * (done[n] - t0), "codes": summary}


if __name__ == "__main__":
    main()
