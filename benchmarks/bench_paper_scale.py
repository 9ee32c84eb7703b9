"""Benchmark at the paper's scale: the engine, the per-token method and graft attribution on
the architectures of the paper's models (random weights, nothing downloaded), each measured
beside what ``weightgraft plan`` predicts.

For each model (``random:llama-3.2-1b``, ``random:gemma-1.1-2b``, ``random:gpt2-xl``,
``random:pythia-2.8b`` by default; any ``random:`` spec or ``PATH/config.json`` with
``--models``), in its own process (so that its peak memory is its own):

- dtype: float32 where the plan of the two models and a batch fits the memory budget (90% of
  the memory available at the start, or of ``--memory``), else bfloat16 (``--dtype`` forces
  one; bfloat16 matmuls are ~7x slower than float32 on CPUs without AVX512-BF16); the donor is
  ``random:NAME@1``, lean: it holds only the tensors the position family grafts (drawn exactly
  as the full donor's);
- the position family's 8 schemes (``wg.presets.position()``) over ``--prompts`` prompts of
  10-25 random token ids (the paper's movie prompts' lengths; the first entity is tokens 1-3):
  seconds per (prompt, scheme) row for ``graft_forward`` (the engine), ``prefix_forward`` (the
  runner's default, prefix sharing), a plain forward pass of the base, and the per-token
  method (``per_token_forward``; by default the paper's procedure, a fresh model copy per
  position; where two copies do not fit, its faster variant that reloads only the slots that
  change, and the report says so), timed on ``--per-token-rows`` rows and extrapolated;
- graft attribution of every cell of ``--attr-prompts`` prompts (``graft_attribution``, as
  ``localize`` runs it) against a plain forward + backward (gradient w.r.t. the input
  embeddings, weights frozen), time and peak memory;
- the plan's predicted peak and time beside each measured one (``plan_rows`` /
  ``plan_attribution``: the arithmetic of ``weightgraft plan``); a phase whose plan does not fit
  the budget is skipped, and the report says so.

Peak memory is the process's resident memory (sampled every 5 ms; on CUDA, allocated bytes).
Targets reported with a status: engine <= 1.3x plain forward and >= 100x faster than the
per-token method; attribution <= 4x forward + backward; plan within 15% of the measured peak
and within 2x of the measured time. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_paper_scale.py                          # all four; hours on 2 CPU cores
    python benchmarks/bench_paper_scale.py --models gpt2-xl --prompts 16
    python benchmarks/bench_paper_scale.py --quick --models random:PATH/config.json --no-write
    python benchmarks/bench_paper_scale.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAPER_MODELS = ["llama-3.2-1b", "gemma-1.1-2b", "gpt2-xl", "pythia-2.8b"]
BEGIN, END = "<!-- paper-scale:begin -->", "<!-- paper-scale:end -->"
TARGETS = {"engine_vs_plain": 1.3, "speedup_vs_per_token": 100.0, "attribution_vs_fwd_bwd": 4.0,
           "plan_peak_error": 0.15, "plan_time_factor": 2.0}


def _spec(name: str) -> str:
    if name.startswith("random:"):
        return name
    if name.endswith(".json") or os.sep in name:
        return f"random:{name}"
    return f"random:{name}"


# ------------------------------------------------------------------------------------------
# one model (runs in its own process)
# ------------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _prompts(n: int, vocab: int, seed: int, lo: int = 10, hi: int = 25):
    """Token ids of ``n`` prompts of lo..hi tokens; offsets of 4 characters per token (BOS
    first) and the first entity at tokens 1..3, so the position schemes place as on text."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        ids = torch.randint(1, vocab, (length,), generator=gen).tolist()
        offsets = [(0, 0)] + [(4 * i, 4 * i + 4) for i in range(length - 1)]
        out.append((ids, offsets, {"first_actor": (0, 12)}))
    return out


def _position_items(base, prompts):
    """GraftItems of the position family (8 schemes) on ``prompts``, and the slots the donor serves."""
    import weightgraft as wg
    from weightgraft.engine.architectures import model_slots
    from weightgraft.engine.sharing.prefix import GraftItem
    from weightgraft.engine.source_map import SourceMap
    from weightgraft.schemes.protocol import embeddings_tied
    from weightgraft.schemes.scheme import compile_scheme

    schemes = wg.presets.position()
    names = wg.slots(base)
    heads = {s.name: s.heads for s in model_slots(base) if s.heads}
    compiled = [compile_scheme(s, names, {"pre": 0, "sft": 1}, heads, tied_embeddings=embeddings_tied(base))
                for s in schemes]
    items, served = [], set()
    for ids, offsets, spans in prompts:
        for c in compiled:
            src, _ = c.sources(offsets, spans)
            items.append(GraftItem(ids, SourceMap(src)))
            served |= {names[i] for i in (src == 1).any(0).nonzero().flatten().tolist()}
    return schemes, items, served


def _left_padded(items, device: str):
    import torch

    seq = max(len(it) for it in items)
    n_slots = items[0].maps.slots.shape[1]
    ids = torch.zeros((len(items), seq), dtype=torch.long)
    mask = torch.zeros_like(ids)
    source = torch.zeros((len(items), seq, n_slots), dtype=torch.long)
    for b, it in enumerate(items):
        n = len(it)
        ids[b, seq - n:] = torch.tensor(list(it.input_ids))
        mask[b, seq - n:] = 1
        source[b, seq - n:] = it.maps.slots
    return ids.to(device), mask.to(device), source.to(device)


def _release() -> None:
    """Give freed memory back to the OS, so a phase's peak is not an earlier phase's leftover."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _timed(fn, device: str):
    from bench_engine import PeakMemory

    _release()
    with PeakMemory(device) as mem:
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        seconds = time.perf_counter() - t0
    return seconds, mem.peak


def _budget(args) -> int:
    from weightgraft.planning.budget import budget
    from weightgraft.planning.plan import HEADROOM

    return int(budget(args.device, args.memory).limit * HEADROOM)


def _plans(spec: str, dtype: str, items_rows, served, lengths_attr, args, with_time: bool):
    from weightgraft.models.spec import parse_spec
    from weightgraft.planning.costs import dtype_bytes, lean_bytes, param_bytes
    from weightgraft.planning.rows import plan_attribution, plan_rows

    fp = parse_spec(spec).footprint()
    donor_bytes = lean_bytes(fp, served, dtype)
    sources = sum(t * len(fp.slot_names) * 8 for t, _ in items_rows)
    engine = plan_rows(spec, {f"{spec}@1": served}, items_rows, dtype, args.batch_size, device=args.device,
                       memory=args.memory, with_time=with_time, extra_bytes=sources)
    emb = fp.meta.get_input_embeddings().weight
    out = fp.meta.get_output_embeddings()
    tied = out is not None and out.weight is emb
    # the reference's private model copy (its tied embedding untied: one more matrix)
    copy = param_bytes(fp, dtype) + (emb.numel() * dtype_bytes(dtype) if tied else 0)
    # the paper's procedure makes a fresh copy per position while the last one is still held
    per_token_peak = engine.peak_bytes + copy * (2 if args.per_token == "copy" else 1)
    attribution = plan_attribution(spec, donor_bytes, lengths_attr, dtype, args.attr_batch, device=args.device,
                                   memory=args.memory, with_time=with_time, donor_slots=served)
    return engine, per_token_peak, attribution


def run_one(args) -> dict:
    """Every measurement of one model; returns the row for the report."""
    import torch

    import weightgraft as wg
    from weightgraft.engine.attribution import graft_attribution
    from weightgraft.engine.partial import PartialGraft
    from weightgraft.engine.reference import CompositeModel, per_token_forward
    from weightgraft.engine.sharing.prefix import prefix_forward
    from weightgraft.models import load_model
    from weightgraft.models.lean import memory_report, needed_parameters
    from weightgraft.models.random_models import lean_random_donor
    from weightgraft.models.spec import parse_spec
    from weightgraft.planning.costs import param_bytes

    spec = _spec(args.one)
    fp = parse_spec(spec).footprint()
    prompts = _prompts(args.prompts, fp.vocab, 0)
    attr_prompts = prompts[: args.attr_prompts]
    out: dict = {"model": spec, "n_params": fp.n_params, "prompts": len(prompts), "device": args.device,
                 "skipped": []}
    budget = _budget(args)
    out["budget_bytes"] = budget
    # the slots the position family grafts from the donor, from the meta model (nothing loaded)
    _, meta_items, served = _position_items(fp.meta, prompts)
    rows = [(len(it), 1) for it in meta_items]
    lengths_attr = [len(ids) for ids, _, _ in attr_prompts]
    dtype = args.dtype
    if dtype == "auto":  # float32 where the two models (and a batch) fit, else bfloat16
        engine, _, _ = _plans(spec, "float32", rows, served, lengths_attr, args, with_time=False)
        dtype = "float32" if engine.peak_bytes <= budget else "bfloat16"
    out["dtype"] = dtype
    engine_plan, per_token_peak, attr_plan = _plans(spec, dtype, rows, served, lengths_attr, args, with_time=True)
    out["plan_engine"] = {"peak_bytes": engine_plan.peak_bytes, "predicted_seconds": engine_plan.predicted_seconds,
                          "memory": engine_plan.memory}
    out["plan_per_token_peak"] = per_token_peak
    out["plan_attribution"] = {"peak_bytes": attr_plan.peak_bytes, "predicted_seconds": attr_plan.predicted_seconds,
                               "memory": attr_plan.memory}
    print(f"[{spec}] {dtype}; plan: engine peak {engine_plan.peak_bytes / 2**30:.2f} GiB, "
          f"{engine_plan.predicted_seconds:.0f} s; attribution peak {attr_plan.peak_bytes / 2**30:.2f} GiB, "
          f"{attr_plan.predicted_seconds:.0f} s; budget {budget / 2**30:.2f} GiB", flush=True)
    if args.plan_only:
        out["skipped"].append("everything: --plan-only")
        return out
    if engine_plan.peak_bytes > budget:
        out["skipped"].append(f"everything: the plan needs {engine_plan.peak_bytes / 2**30:.1f} GiB for the engine")
        return out
    torch_dtype = getattr(torch, dtype)
    t0 = time.perf_counter()
    base = load_model(spec, dtype=torch_dtype, device=args.device)
    out["load_base_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    donor = lean_random_donor(f"{spec}@1", base, needed_parameters(base.model, served))
    out["load_donor_s"] = time.perf_counter() - t0
    out["donor_bytes_held"] = memory_report(donor.model, base.model).bytes_held
    models = [base.model, donor.model]
    _, items, _ = _position_items(base.model, prompts)
    batches = [items[i : i + args.batch_size] for i in range(0, len(items), args.batch_size)]
    padded = [_left_padded(b, args.device) for b in batches]
    n_rows = len(items)

    with torch.no_grad():  # warm-up
        ids, mask, src = padded[0]
        wg.graft_forward(models, ids[:2], src[:2], attention_mask=mask[:2])

        def engine():
            for ids, mask, src in padded:
                last = torch.full((ids.shape[0], 1), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
                wg.graft_forward(models, ids, src, attention_mask=mask, logit_positions=last)

        def prefix():
            for chunk in batches:
                prefix_forward(models, chunk, 0)

        def plain():
            for ids, mask, _ in padded:
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                base.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=False)

        out["engine_s"], out["engine_peak"] = _timed(engine, args.device)
        out["prefix_s"], out["prefix_peak"] = _timed(prefix, args.device)
        out["plain_s"], out["plain_peak"] = _timed(plain, args.device)
    out["rows"] = n_rows
    print(f"[{spec}] engine {out['engine_s'] / n_rows:.4f} s/row, prefix {out['prefix_s'] / n_rows:.4f}, "
          f"plain {out['plain_s'] / n_rows:.4f}", flush=True)

    if per_token_peak > budget and args.per_token == "copy":  # the reload variant needs one copy less
        per_token_peak -= param_bytes(fp, dtype)
        args.per_token = "reload"
        out["skipped"].append("per-token copy per position (does not fit): the reload variant timed instead")
    out["per_token_variant"] = args.per_token
    if per_token_peak <= budget:
        subset = items[: args.per_token_rows]
        composite = CompositeModel(models)

        def per_token():
            for it in subset:
                ids = torch.tensor([list(it.input_ids)], device=args.device)
                per_token_forward(models, ids, it.maps.slots[None].to(args.device), composite=composite,
                                  copy_per_position=args.per_token == "copy")

        seconds, peak = _timed(per_token, args.device)
        out["per_token_s_per_row"], out["per_token_peak"] = seconds / len(subset), peak
        out["per_token_rows_timed"] = len(subset)
        del composite
    else:
        out["skipped"].append(f"per-token: its private model copy needs {per_token_peak / 2**30:.1f} GiB in all")

    if attr_plan.peak_bytes <= budget and not args.no_attribution:
        ids, mask, _ = _left_padded([items[i * 8] for i in range(len(attr_prompts))], args.device)  # scheme PRE
        seq = ids.shape[1]
        pos = torch.full((ids.shape[0],), seq - 1, dtype=torch.long)
        targets = torch.randint(0, fp.vocab, (ids.shape[0],), generator=torch.Generator().manual_seed(1))
        t0 = time.perf_counter()
        pair = PartialGraft(base.model, donor.model)
        out["deltas_s"] = time.perf_counter() - t0

        def attribution():
            for i in range(0, ids.shape[0], args.attr_batch):
                graft_attribution(pair, ids[i : i + args.attr_batch], pos[i : i + args.attr_batch],
                                  targets=targets[i : i + args.attr_batch], attention_mask=mask[i : i + args.attr_batch])

        def forward_backward():
            emb = base.model.get_input_embeddings()
            for i in range(0, ids.shape[0], args.attr_batch):
                sl = slice(i, i + args.attr_batch)
                x = emb(ids[sl]).detach().requires_grad_(True)
                p = (mask[sl].cumsum(-1) - 1).clamp(min=0)
                logits = base.model(inputs_embeds=x, attention_mask=mask[sl], position_ids=p, logits_to_keep=1,
                                    use_cache=False).logits[:, -1].float()
                lp = torch.log_softmax(logits, -1)[torch.arange(logits.shape[0]), targets[sl].to(logits.device)]
                torch.autograd.grad(lp.sum(), x)

        with torch.enable_grad():
            attribution()  # warm-up on the same rows
            out["attribution_s"], out["attribution_peak"] = _timed(attribution, args.device)
            forward_backward()
            out["fwd_bwd_s"], out["fwd_bwd_peak"] = _timed(forward_backward, args.device)
        out["attr_prompts"] = int(ids.shape[0])
        out["cells_per_prompt"] = int(seq * len(pair.slots))
        del pair
    else:
        out["skipped"].append("attribution: " + ("--no-attribution" if args.no_attribution else
                              f"the plan needs {attr_plan.peak_bytes / 2**30:.1f} GiB"))
    return out


# ------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------


def _status(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def _ratios(r: dict) -> dict:
    n = r.get("rows")
    out = {}
    if n:
        out["engine_vs_plain"] = r["engine_s"] / r["plain_s"]
        out["prefix_vs_plain"] = r["prefix_s"] / r["plain_s"]
        if "per_token_s_per_row" in r:
            out["speedup_vs_per_token"] = r["per_token_s_per_row"] / (r["engine_s"] / n)
        out["plan_engine_peak_error"] = r["plan_engine"]["peak_bytes"] / r["engine_peak"] - 1
        out["plan_engine_time_factor"] = r["plan_engine"]["predicted_seconds"] / r["engine_s"]
    if "attribution_s" in r:
        out["attribution_vs_fwd_bwd"] = r["attribution_s"] / r["fwd_bwd_s"]
        out["plan_attr_peak_error"] = r["plan_attribution"]["peak_bytes"] / r["attribution_peak"] - 1
        out["plan_attr_time_factor"] = r["plan_attribution"]["predicted_seconds"] / r["attribution_s"]
    return out


def _within_factor(x: float | None, f: float) -> bool | None:
    return None if x is None else (1 / f <= x <= f)


def _machine(device: str) -> str:
    from weightgraft.planning.calibration import _device_name

    return _device_name(device)


def report(results: list[dict], args, command: str) -> str:
    import torch

    gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    lines = [BEGIN, "## Paper-scale models (`benchmarks/bench_paper_scale.py`)", "",
             f"- command: `{command}`",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, machine: {_machine(args.device)}, "
             f"{os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}",
             f"- random weights (`random:NAME`, donor `@1` lean), position family (8 schemes) over {args.prompts} prompts "
             f"of 10-25 token ids, batch {args.batch_size}; attribution on {args.attr_prompts} prompts; the per-token "
             f"method timed on {args.per_token_rows} row(s) and extrapolated",
             "- peak = the process's resident memory during the phase (CUDA: allocated); plan = `plan_rows` / "
             "`plan_attribution`, the arithmetic of `weightgraft plan`", ""]
    lines += ["| model | dtype | params | engine s/row | prefix s/row | plain s/row | per-token s/row | engine/plain | "
              "speedup vs per-token | engine peak GiB (plan) | engine s (plan) | attribution s (plan) | fwd+bwd s | "
              "attr/fwd+bwd | attribution peak GiB (plan) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    checks = []
    for r in results:
        q = _ratios(r)
        n = r.get("rows") or 1
        cell = lambda key, fmt="{:.4f}", div=1, r=r: (fmt.format(r[key] / div) if key in r else "-")  # noqa: E731
        lines.append(
            f"| {r['model']} | {r.get('dtype', '-')} | {r['n_params'] / 1e9:.2f} B | {cell('engine_s', div=n)} | "
            f"{cell('prefix_s', div=n)} | {cell('plain_s', div=n)} | {cell('per_token_s_per_row')} ({r.get('per_token_variant', '-')}) | "
            f"{q.get('engine_vs_plain', float('nan')):.2f} | {q.get('speedup_vs_per_token', float('nan')):.0f} | "
            f"{gib(r['engine_peak']) if 'engine_peak' in r else '-'} ({gib(r['plan_engine']['peak_bytes'])}) | "
            f"{cell('engine_s', '{:.1f}')} ({r['plan_engine']['predicted_seconds']:.1f}) | "
            f"{cell('attribution_s', '{:.2f}')} ({r['plan_attribution']['predicted_seconds']:.2f}) | "
            f"{cell('fwd_bwd_s', '{:.2f}')} | {q.get('attribution_vs_fwd_bwd', float('nan')):.2f} | "
            f"{gib(r['attribution_peak']) if 'attribution_peak' in r else '-'} "
            f"({gib(r['plan_attribution']['peak_bytes'])}) |")
        checks.append((r["model"], q, r["skipped"]))
    lines += ["", "Targets:", ""]
    for model, q, skipped in checks:
        e, s, a = q.get("engine_vs_plain"), q.get("speedup_vs_per_token"), q.get("attribution_vs_fwd_bwd")
        pe = [v for k, v in q.items() if k.endswith("peak_error")]
        pt = [v for k, v in q.items() if k.endswith("time_factor")]
        lines.append(
            f"- {model}: engine <= 1.3x plain: {_status(None if e is None else e <= TARGETS['engine_vs_plain'])}; "
            f">= 100x per-token: {_status(None if s is None else s >= TARGETS['speedup_vs_per_token'])}; "
            f"attribution <= 4x fwd+bwd: {_status(None if a is None else a <= TARGETS['attribution_vs_fwd_bwd'])}; "
            f"plan peak within 15%: {_status(None if not pe else all(abs(v) <= TARGETS['plan_peak_error'] for v in pe))} "
            f"({', '.join(f'{v:+.0%}' for v in pe)}); plan time within 2x: "
            f"{_status(None if not pt else all(_within_factor(v, TARGETS['plan_time_factor']) for v in pt))} "
            f"({', '.join(f'{v:.2f}x' for v in pt)})" + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
    lines += [END]
    return "\n".join(lines)


def write_section(text: str, path: Path) -> None:
    old = path.read_text() if path.is_file() else "# Benchmark results\n"
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(PAPER_MODELS), help="comma-separated shipped names or random: specs")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--attr-prompts", type=int, default=8)
    ap.add_argument("--attr-batch", type=int, default=8)
    ap.add_argument("--per-token-rows", type=int, default=2)
    ap.add_argument("--per-token", default="copy", choices=["copy", "reload"],
                    help="copy: the paper's procedure, a fresh model copy per position (falls back to reload "
                    "where two copies do not fit); reload: one private copy, changed slots reloaded")
    ap.add_argument("--batch-size", type=int, default=64, help="rows per grafted forward batch")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--memory", default=None, help="memory budget (default: this device's free memory)")
    ap.add_argument("--quick", action="store_true", help="8 prompts, 2 attribution prompts, 1 per-token row")
    ap.add_argument("--no-attribution", action="store_true")
    ap.add_argument("--plan-only", action="store_true", help="print each model's dtype and plans, load nothing")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not touch RESULTS.md")
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one model, JSON out
    ap.add_argument("--json-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.attr_prompts, args.per_token_rows = min(args.prompts, 8), min(args.attr_prompts, 2), 1
    if args.one is not None:
        sys.path.insert(0, str(HERE))
        from weightgraft.runtime import apply_thread_default

        apply_thread_default()
        result = run_one(args)
        args.json_out.write_text(json.dumps(result, default=float))
        return
    command = "python benchmarks/bench_paper_scale.py " + " ".join(sys.argv[1:])
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        out = HERE / f".paper_scale_{os.getpid()}.json"
        child = [sys.executable, __file__, "--one", name, "--json-out", str(out)] + [
            a for a in sys.argv[1:] if a not in ("--no-write",)]
        drop = {"--models"}
        cleaned, skip = [], False
        for a in child:
            if skip:
                skip = False
                continue
            if a in drop:
                skip = True
                continue
            if a.startswith("--models="):
                continue
            cleaned.append(a)
        code = subprocess.call(cleaned)
        if code != 0 or not out.is_file():
            print(f"[{name}] failed (exit {code})", file=sys.stderr)
            continue
        results.append(json.loads(out.read_text()))
        out.unlink()
    text = report(results, args, command)
    print(text)
    if not args.no_write and results:
        write_section(text, args.results)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
