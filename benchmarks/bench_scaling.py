"""Benchmark: how graft_forward's time and memory scale, against plain forward passes.

Times one batched ``graft_forward`` (logits at the last position only) and one plain forward
pass of the base model over the same left-padded sequences (``logits_to_keep=1``), as a
function of

  1. sequence length (batch fixed; token ids from the test prompts, concatenated; each row
     grafts a random subset of its positions, every slot but the unembedding, from the donor),
  2. batch size (rows of test prompts, ~10 tokens, each with one of the paper's position
     schemes FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C in turn),
  3. number of schemes per example over a fixed set of examples (items = examples x schemes;
     the position presets first, then random position subsets),
  4. number of models (base + 1 or 2 perturbed donors; with 2 donors each grafted position
     draws its donor at random, so the maps draw from all models).

Per point: median wall time of ``--repeats`` runs after a warm-up, time per row, ratio to the
plain pass and peak extra memory (``bench_engine.PeakMemory``: sampled RSS on CPU, after
releasing freed heap with ``malloc_trim``; peak allocated on CUDA), measured during the
warm-up run. Prints one table per curve, writes a 4-panel plot and the section between
``<!-- scaling:begin -->`` and ``<!-- scaling:end -->`` of ``benchmarks/RESULTS.md``.

    python benchmarks/bench_scaling.py                  # embedded SmolLM2-135M, CPU (~5 min on 2 cores)
    python benchmarks/bench_scaling.py --quick          # tiny random model, seconds; writes nothing
    python benchmarks/bench_scaling.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import gc
import os
import platform
import re
import shlex
import statistics
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_engine import (  # noqa: E402
    PeakMemory,
    _sync,
    build_prompts,
    left_padded,
    perturbed_copy,
    scheme_sources,
)

import weightgraft as wg  # noqa: E402

BEGIN, END = "<!-- scaling:begin -->", "<!-- scaling:end -->"
# The grafting position schemes first (a 1-scheme run should graft something), then the baselines.
PRESET_ORDER = ["FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C", "PRE", "SFT"]

DEFAULTS = dict(
    seq_lens=[8, 16, 32, 64, 128], seq_batch=32,
    batch_sizes=[1, 4, 16, 64, 256],
    schemes=[1, 2, 4, 8, 16], scheme_examples=16,
    models=[2, 3], model_rows=128,
    repeats=3,
)
QUICK = dict(
    seq_lens=[8, 16, 32], seq_batch=4,
    batch_sizes=[1, 4, 16],
    schemes=[1, 2, 4], scheme_examples=4,
    models=[2, 3], model_rows=16,
    repeats=2,
)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _release_heap() -> None:
    """Give freed heap back to the OS, so that sampled RSS growth reflects this block only."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def tiny_like(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """A small random model of the same architecture and vocabulary (for ``--quick``)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    for key, value in dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16).items():
        if hasattr(config, key):
            setattr(config, key, value)
    torch.manual_seed(seed)
    tiny = AutoModelForCausalLM.from_config(config)
    return tiny.to(dtype=next(model.parameters()).dtype, device=next(model.parameters()).device).eval()


# ---------------------------------------------------------------------------------------- inputs


def random_subset_source(n: int, n_slots: int, gen: torch.Generator) -> torch.Tensor:
    """``[n, n_slots]``: a random subset of positions (at least one, not all) grafted from model
    1 on every slot but the unembedding, as in the paper's position schemes."""
    src = torch.zeros((n, n_slots), dtype=torch.long)
    frac = 0.2 + 0.6 * torch.rand((), generator=gen)
    chosen = torch.rand(n, generator=gen) < frac
    if n > 1:
        order = torch.randperm(n, generator=gen)
        chosen[order[0]], chosen[order[1]] = True, False
    src[chosen, :-1] = 1  # the unembedding ("unembed", the last slot) stays the base's
    return src


def spread_donors(source: torch.Tensor, n_models: int, gen: torch.Generator) -> torch.Tensor:
    """Each grafted position of a ``[n, n_slots]`` map draws its donor from models 1..n_models-1."""
    if n_models <= 2:
        return source
    donor = torch.randint(1, n_models, (source.shape[0], 1), generator=gen)
    return torch.where(source != 0, donor.expand_as(source), source)


def batch_of(rows: list[tuple[list[int], torch.Tensor]], pad: int):
    """Left-padded ``ids, mask, source`` for (token ids, source map) rows (bench_engine.left_padded)."""
    items = [(SimpleNamespace(input_ids=ids, sources={"s": src}), "s") for ids, src in rows]
    return left_padded(items, pad)


# ------------------------------------------------------------------------------------------ timing


def measure(models, ids, mask, source, device: str, repeats: int) -> dict:
    """A warm-up run of each (which measures peak memory), then ``repeats`` alternating timed
    runs of graft_forward and the plain pass."""
    ids, mask, source = ids.to(device), mask.to(device), source.to(device)
    last = torch.full((ids.shape[0], 1), ids.shape[1] - 1, dtype=torch.long, device=device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    def graft():
        wg.graft_forward(models, ids, source, attention_mask=mask, logit_positions=last)

    def plain():
        models[0](input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=False)

    fns = {"graft": graft, "plain": plain}
    times: dict[str, list[float]] = {k: [] for k in fns}
    mem: dict[str, float] = {}
    with torch.no_grad():
        for name, fn in fns.items():  # warm-up at this shape, which also measures memory
            _release_heap()
            with PeakMemory(device) as pm:
                fn()
            mem[name] = pm.extra_mib
        for _ in range(repeats):  # alternate, so that drifts in machine load hit both alike
            for name, fn in fns.items():
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                times[name].append(time.perf_counter() - t0)
    rows = ids.shape[0]
    out = {"rows": rows, "seq": ids.shape[1], "tokens": int(mask.sum())}
    for name in fns:
        t = statistics.median(times[name])
        out[f"{name}_s"] = t
        out[f"{name}_ms_row"] = 1000 * t / rows
        out[f"{name}_mib"] = mem[name]
    out["ratio"] = out["graft_s"] / out["plain_s"]
    return out


# ------------------------------------------------------------------------------------------ tables


def table(title: str, key: str, points: list[dict]) -> str:
    head = (f"| {key} | rows | seq | graft (s) | plain (s) | graft ms/row | plain ms/row | "
            "graft/plain | graft peak +MiB | plain peak +MiB |")
    lines = [f"**{title}**", "", head, "|" + "---:|" * (head.count("|") - 1)]
    for p in points:
        lines.append(
            f"| {p[key]} | {p['rows']} | {p['seq']} | {p['graft_s']:.3f} | {p['plain_s']:.3f} | "
            f"{p['graft_ms_row']:.2f} | {p['plain_ms_row']:.2f} | {p['ratio']:.2f} | "
            f"{p['graft_mib']:.0f} | {p['plain_mib']:.0f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ output


def plot(curves: dict, path: Path, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, (name, (key, xlabel, points)) in zip(axes.flat, curves.items()):
        x = [p[key] for p in points]
        categorical = key == "models"
        xs = list(range(len(x))) if categorical else x
        ax.plot(xs, [p["graft_ms_row"] for p in points], "o-", color="C0", label="graft_forward time/row")
        ax.plot(xs, [p["plain_ms_row"] for p in points], "s-", color="C1", label="plain forward time/row")
        for xi, p in zip(xs, points):
            ax.annotate(f"x{p['ratio']:.2f}", (xi, p["graft_ms_row"]), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=8, color="C0")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("time per row (ms)")
        ax.set_title(textwrap.fill(name, 60), fontsize=9)
        if categorical:
            ax.set_xticks(xs, [str(v) for v in x])
            ax.set_xlim(-0.5, len(x) - 0.5)
        else:
            ax.set_xscale("log", base=2)
            ax.set_xticks(x, [str(v) for v in x])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        mem = ax.twinx()
        mem.plot(xs, [p["graft_mib"] for p in points], "o:", color="C0", alpha=0.5, label="graft_forward peak +MiB")
        mem.plot(xs, [p["plain_mib"] for p in points], "s:", color="C1", alpha=0.5, label="plain peak +MiB")
        mem.set_ylabel("peak extra memory (MiB, dotted)")
        mem.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = mem.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="best", framealpha=0.6)
    fig.suptitle(f"graft_forward vs plain forward: time per row (solid) and peak extra memory (dotted)\n{subtitle}",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_section(results: Path, body: str) -> None:
    """Replace the text between the scaling markers (append the section if they are missing);
    everything else in the file is left as it is."""
    section = f"{BEGIN}\n{body.rstrip()}\n{END}"
    if results.exists():
        text = results.read_text(encoding="utf-8")
        pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: section, text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
    else:
        text = f"# Benchmark results\n\n{section}\n"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text, encoding="utf-8")


def cpu_busy_s() -> float:
    """CPU-seconds all processes have spent busy (non-idle, non-iowait) since boot (0 if unknown)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    except (OSError, ValueError, IndexError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# -------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="base model spec")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--quick", action="store_true",
                    help="tiny random model of the same architecture, small sizes (smoke run)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seq-lens", type=_ints, default=None, help="e.g. 8,16,32,64,128")
    ap.add_argument("--seq-batch", type=int, default=None, help="rows in the sequence-length curve")
    ap.add_argument("--batch-sizes", type=_ints, default=None, help="e.g. 1,4,16,64,256")
    ap.add_argument("--schemes", type=_ints, default=None, help="schemes per example, e.g. 1,2,4,8,16")
    ap.add_argument("--scheme-examples", type=int, default=None, help="examples in the schemes curve")
    ap.add_argument("--models", type=_ints, default=None, help="model counts, e.g. 2,3")
    ap.add_argument("--model-rows", type=int, default=None, help="rows in the models curve")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per point (median)")
    ap.add_argument("--results", type=Path, default=None,
                    help="markdown file to write the section to (default benchmarks/RESULTS.md; "
                         "--quick writes none unless given)")
    ap.add_argument("--plot", type=Path, default=None,
                    help="plot path (default benchmarks/scaling.png; --quick writes none unless given)")
    args = ap.parse_args()
    cfg = dict(QUICK if args.quick else DEFAULTS)
    for key in cfg:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    results = args.results if args.results or args.quick else HERE / "RESULTS.md"
    plot_path = args.plot if args.plot or args.quick else HERE / "scaling.png"
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    started = time.perf_counter()
    busy_before, own_before = cpu_busy_s(), os.times()

    loaded, tok = wg.load(args.model, device=args.device, dtype=dtype)
    base = tiny_like(loaded) if args.quick else loaded
    del loaded
    n_models_max = max(cfg["models"] + [2])
    donors = [perturbed_copy(base, seed=i) for i in range(1, n_models_max)]
    all_models = [base, *donors]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    slot_list = wg.slots(base)
    n_slots = len(slot_list)
    gen = torch.Generator().manual_seed(0)

    # Test prompts with the paper's position schemes (FE, LT, ... as source maps).
    n_prompts = max(cfg["batch_sizes"] + [cfg["scheme_examples"], cfg["model_rows"], 16])
    schemes = {s.name: s for s in wg.presets.position()}
    prompts = build_prompts(n_prompts, 0, "headline")
    examples, excluded = scheme_sources({"pre": base, "sft": all_models[1]}, tok, prompts,
                                        [schemes[n] for n in PRESET_ORDER])
    if not examples:
        raise SystemExit("no test prompt could be prepared")
    ex_at = lambda i: examples[i % len(examples)]  # noqa: E731
    grafting = PRESET_ORDER[:6]
    lengths = [len(e.input_ids) for e in examples]
    print(f"model={args.model}{' (tiny random, --quick)' if args.quick else ''} device={args.device} "
          f"dtype={args.dtype} threads={torch.get_num_threads()} slots={n_slots} "
          f"params={sum(p.numel() for p in base.parameters()) / 1e6:.1f}M")
    print(f"prompts={len(examples)} (excluded {excluded}) tokens/prompt={min(lengths)}-{max(lengths)}")
    print(f"sizes: {cfg}")

    models2 = all_models[:2]
    curves: dict[str, tuple[str, str, list[dict]]] = {}

    def run_curve(title, key, xlabel, xs, make):
        points = []
        print(f"\n== {title}")
        for x in xs:
            t0 = time.perf_counter()
            models, (ids, mask, source) = make(x)
            p = measure(models, ids, mask, source, args.device, cfg["repeats"])
            p[key] = x
            points.append(p)
            print(f"  {key}={x:<4} rows={p['rows']:<4} seq={p['seq']:<4} graft {p['graft_s']:.3f}s "
                  f"plain {p['plain_s']:.3f}s ratio {p['ratio']:.2f} mem +{p['graft_mib']:.0f}/"
                  f"+{p['plain_mib']:.0f} MiB  ({time.perf_counter() - t0:.1f}s)", flush=True)
        curves[title] = (key, xlabel, points)

    # 1. sequence length: concatenated prompt tokens, random position subsets grafted.
    stream = [t for i in range(len(examples)) for t in ex_at(i).input_ids]

    def by_seq(n):
        rows = []
        for b in range(cfg["seq_batch"]):
            start = (b * 37) % max(1, len(stream) - n)
            ids = (stream[start:] + stream)[:n]
            rows.append((ids, random_subset_source(n, n_slots, gen)))
        return models2, batch_of(rows, pad)

    run_curve(f"1. sequence length (batch {cfg['seq_batch']}, random position subsets)",
              "seq_len", "sequence length (tokens)", cfg["seq_lens"], by_seq)

    # 2. batch size: one prompt per row, the grafting position schemes in turn.
    def by_batch(n):
        rows = [(ex_at(i).input_ids, ex_at(i).sources[grafting[i % len(grafting)]]) for i in range(n)]
        return models2, batch_of(rows, pad)

    run_curve("2. batch size (test prompts, position schemes FE..LT^C in turn)",
              "batch", "batch size (rows)", cfg["batch_sizes"], by_batch)

    # 3. schemes per example: presets (grafting ones first), then random position subsets.
    extra = {}
    for i in range(cfg["scheme_examples"]):
        ex = ex_at(i)
        extra[i] = [random_subset_source(len(ex.input_ids), n_slots, gen)
                    for _ in range(max(0, max(cfg["schemes"]) - len(PRESET_ORDER)))]

    def by_schemes(k):
        rows = []
        for i in range(cfg["scheme_examples"]):
            ex = ex_at(i)
            maps = [ex.sources[n] for n in PRESET_ORDER] + extra[i]
            rows += [(ex.input_ids, m) for m in maps[:k]]
        return models2, batch_of(rows, pad)

    run_curve(f"3. schemes per example ({cfg['scheme_examples']} examples; presets, then random subsets)",
              "schemes", "schemes per example", cfg["schemes"], by_schemes)

    # 4. number of models: same rows; with more donors each grafted position draws one.
    def by_models(m):
        g = torch.Generator().manual_seed(1)
        rows = [(ex_at(i).input_ids, spread_donors(ex_at(i).sources[grafting[i % len(grafting)]], m, g))
                for i in range(cfg["model_rows"])]
        return all_models[:m], batch_of(rows, pad)

    run_curve(f"4. number of models ({cfg['model_rows']} rows, position schemes, donors drawn per position)",
              "models", "models (base + donors)", cfg["models"], by_models)

    elapsed = time.perf_counter() - started
    own = os.times()
    others = max(0.0, cpu_busy_s() - busy_before
                 - (own.user + own.system - own_before.user - own_before.system))
    tables = "\n\n".join(table(title, key, pts) for title, (key, _, pts) in curves.items())
    print("\n" + tables)
    print(f"\ntotal {elapsed:.0f} s; other processes used {others:.0f} CPU-s meanwhile")

    command = "python benchmarks/bench_scaling.py" + ("" if len(sys.argv) == 1 else " " + shlex.join(sys.argv[1:]))
    machine = (f"{cpu_name()}, {os.cpu_count()} CPUs (torch threads {torch.get_num_threads()}), "
               f"torch {torch.__version__}, device {args.device}"
               + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else "")
               + f", dtype {args.dtype}")
    subtitle = f"{args.model}{' (tiny random)' if args.quick else ''}, {machine}"
    if plot_path:
        plot(curves, plot_path, subtitle)
        print(f"wrote {plot_path}")
    if results:
        try:
            link = os.path.relpath(plot_path, results.parent) if plot_path else None
        except ValueError:
            link = str(plot_path)
        body = "\n".join([
            "## Scaling: graft_forward vs plain forward",
            "",
            f"- command: `{command}`",
            f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
            f"- machine: {machine}",
            f"- model: {args.model}{' (tiny random, --quick)' if args.quick else ''}, "
            f"{len(all_models) - 1} perturbed donor(s); run took {elapsed:.0f} s, during which other "
            f"processes used {others:.0f} CPU-s (CPU timings are only meaningful near 0)",
            f"- per point: median of {cfg['repeats']} runs after a warm-up; graft_forward computes logits at "
            "the last position only, the plain pass uses `logits_to_keep=1`; ratio = graft/plain wall time; "
            "peak +MiB = peak memory above the level before the call (sampled RSS on CPU after "
            "`malloc_trim`, allocated on CUDA), measured during the warm-up run; the donors' weights are "
            "resident before the call and not counted; rows are left-padded to the longest in the batch "
            "(the seq column)",
            "",
            tables,
            "",
            f"![graft_forward scaling]({link})" if link else "",
        ])
        write_section(results, body)
        print(f"wrote {results}")


if __name__ == "__main__":
    main()
