"""Quantized and QLoRA pairs beside their dense pair: the position family's sweep (8 schemes) on
random-weight models of a paper architecture, timed against a plain forward of the same base,
peak memory beside ``weightgraft plan``'s, and how far the quantized pair's grafted outputs are
from the dense pair's (the same schemes, prompts and donor).

Variants (``--variants``, any of them):

- ``dense``: PRE ``random:M``, SFT ``random:M@1``, in ``--dtype``;
- ``nf4``: both roles ``quantized(random:M[@1], nf4)``;
- ``qlora-dense``: PRE ``random:M``, SFT ``peft(pre, ADAPTER)``, a rank-16 all-linear adapter
  with seeded random A and B (what a LoRA finetune leaves; written once to a temporary folder);
- ``qlora``: PRE ``quantized(random:M, nf4)``, the same adapter over it (QLoRA).

Agreement (``nf4`` against ``dense``, ``qlora`` against ``qlora-dense``): at the last position of
every (prompt, scheme) row, whether the two pairs' grafted outputs have the same top-1 token,
and the mean |difference| of the log-probability of the dense pair's top-1 token.

``--compile`` also times the grafted pass at ``--prompts`` prompts under ``torch.compile``
(``mode="reduce-overhead"``, CUDA graphs) against the eager pass, checks it equals the eager
output, and prints the error if it cannot compile.

    python benchmarks/bench_quantized.py --model random:smollm2-135m --prompts 4 --variants dense,nf4,qlora-dense,qlora
    python benchmarks/bench_quantized.py --model random:llama-3.1-8b --device cuda --dtype bfloat16 --prompts 32
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_paper_scale import _left_padded, _position_items, _prompts  # noqa: E402

import weightgraft as wg  # noqa: E402
from weightgraft.models.donors import LoadSettings, load_role  # noqa: E402
from weightgraft.models.spec import parse_spec  # noqa: E402

GiB = 2**30


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / GiB if device.startswith("cuda") else None


def write_adapter(spec: str, out: Path, rank: int = 16, seed: int = 0) -> Path:
    """A peft adapter directory for ``spec``'s architecture: rank ``rank`` on every linear layer of
    the blocks, A and B seeded random (B scaled so the adapter moves outputs as a finetune would)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    meta = parse_spec(spec).footprint().meta
    gen = torch.Generator().manual_seed(seed)
    tensors, targets = {}, set()
    for name, module in meta.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
            targets.add(name.rsplit(".", 1)[-1])
            a = torch.randn(rank, module.in_features, generator=gen) / module.in_features**0.5
            b = torch.randn(module.out_features, rank, generator=gen) * 0.02
            tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=sorted(targets), task_type="CAUSAL_LM").save_pretrained(str(out))
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def roles_of(variant: str, spec: str, adapter: Path) -> dict[str, str]:
    q = f"quantized({spec}, nf4)"
    return {
        "dense": {"pre": spec, "sft": f"{spec}@1"},
        "nf4": {"pre": q, "sft": f"quantized({spec}@1, nf4)"},
        "qlora-dense": {"pre": spec, "sft": f"peft(pre, {adapter})"},
        "qlora": {"pre": q, "sft": f"peft(pre, {adapter})"},
    }[variant]


def plan_peak(roles: dict[str, str], rows: list[tuple[int, int]], dtype: str, batch: int, device: str) -> float | None:
    """``weightgraft plan``'s peak for the pair and these rows (None, and why, where it cannot plan)."""
    try:
        from weightgraft.planning.rows import plan_rows

        plan = plan_rows(roles["pre"], {roles["sft"]: None}, rows, dtype, batch, device=device)
        return plan.peak_bytes / GiB
    except Exception as exc:  # noqa: BLE001  (a benchmark reports what the plan cannot do)
        print(f"  plan: unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})", flush=True)
        return None


@torch.no_grad()
def run_variant(variant: str, args: argparse.Namespace, adapter: Path, prompts: list) -> dict:
    roles = roles_of(variant, args.model, adapter)
    dtype = getattr(torch, args.dtype)
    settings = LoadSettings(device=args.device, dtype=dtype)
    _peak_reset(args.device)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = load_role(roles["pre"], settings, roles=roles)
        sft = load_role(roles["sft"], settings, roles=roles, loaded={"pre": pre})
    load_s = time.perf_counter() - t0
    models = [pre.model, sft.model]
    _, items, _ = _position_items(pre.model, prompts)
    batches = [_left_padded(items[i : i + args.batch_size], args.device) for i in range(0, len(items), args.batch_size)]

    def engine(keep: bool = False) -> list[torch.Tensor]:
        outs = []
        for ids, mask, src in batches:
            last = torch.full((ids.shape[0], 1), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
            out = wg.graft_forward(models, ids, src, attention_mask=mask, logit_positions=last)
            if keep:  # the outputs, kept on the CPU (not counted in the peak)
                outs.append(out[:, -1].float().log_softmax(-1).cpu())
        return outs

    def plain() -> None:
        for ids, mask, _ in batches:
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            pre.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=False)

    engine()  # warm-up (kernels, caches)
    plain()
    times = {}
    for name, fn in (("engine", engine), ("plain", plain)):
        best = float("inf")
        for _ in range(args.repeats):
            _sync(args.device)
            t0 = time.perf_counter()
            fn()
            _sync(args.device)
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    peak = _peak(args.device)  # loading, warm-up and the timed passes
    logits = torch.cat(engine(keep=True))
    rows = [(len(it), 1) for it in items]
    out = {"variant": variant, "roles": roles, "rows": len(items), "load_s": load_s,
           "engine_s": times["engine"], "plain_s": times["plain"], "ratio": times["engine"] / times["plain"],
           "peak_gib": peak, "plan_gib": plan_peak(roles, rows, args.dtype, args.batch_size, args.device),
           "held_gib": sum(t.numel() * t.element_size() for t in pre.model.state_dict().values()) / GiB}
    if args.compile and variant == args.variants.split(",")[0]:
        out["compile"] = try_compile(models, batches[:1], [logits[: batches[0][0].shape[0]]], args.device)
    print(f"[{variant}] {len(items)} rows, load {load_s:.1f} s; engine {times['engine']:.4f} s, plain "
          f"{times['plain']:.4f} s ({out['ratio']:.2f}x); peak {out['peak_gib']} GiB, plan {out['plan_gib']} GiB, "
          f"PRE holds {out['held_gib']:.2f} GiB", flush=True)
    return {**out, "_logprobs": logits}


def try_compile(models: list, batches: list, eager: list[torch.Tensor], device: str) -> dict:
    """The grafted pass under ``torch.compile(mode="reduce-overhead")``: its time and its largest
    difference from the eager pass, or the error that stopped it."""
    def one(ids: torch.Tensor, mask: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        last = torch.full((ids.shape[0], 1), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
        return wg.graft_forward(models, ids, src, attention_mask=mask, logit_positions=last)[:, -1].float().log_softmax(-1)

    try:
        compiled = torch.compile(one, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            outs = [compiled(*b).clone() for b in batches]
        _sync(device)
        t0 = time.perf_counter()
        outs = [compiled(*b).clone() for b in batches]
        _sync(device)
        seconds = time.perf_counter() - t0
        _sync(device)
        t0 = time.perf_counter()
        eager_again = [one(*b) for b in batches]
        _sync(device)
        eager_s = time.perf_counter() - t0
        worst = max((a.cpu() - b).abs().max().item() for a, b in zip(outs, eager))
        print(f"  eager on the same batch: {eager_s:.4f} s ({len(eager_again)} batch)", flush=True)
        print(f"  torch.compile(reduce-overhead): {seconds:.4f} s, worst |diff| from eager {worst:.2e}", flush=True)
        return {"seconds": seconds, "eager_seconds": eager_s, "worst_diff": worst}
    except Exception as exc:  # noqa: BLE001  (the experiment reports why it could not compile)
        line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        print(f"  torch.compile(reduce-overhead) failed: {line}", flush=True)
        return {"error": line}


def agreement(quant: dict, dense: dict) -> dict:
    q, d = quant["_logprobs"], dense["_logprobs"]
    top = d.argmax(-1)
    same = (q.argmax(-1) == top).float().mean().item()
    delta = (q.gather(-1, top[:, None]) - d.gather(-1, top[:, None])).abs().mean().item()
    return {"top1_agree": same, "mean_abs_dlogprob": delta}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:llama-3.2-1b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="dense,nf4,qlora-dense,qlora")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    fp = parse_spec(args.model).footprint()
    prompts = _prompts(args.prompts, fp.vocab, 0)
    print(f"{args.model}: {fp.n_params / 1e9:.2f}B parameters, {args.prompts} prompts x 8 schemes, {args.dtype}, "
          f"{args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""), flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="wg-adapter-") as tmp:
        adapter = write_adapter(args.model, Path(tmp) / "adapter")
        for variant in args.variants.split(","):
            results[variant] = run_variant(variant, args, adapter, prompts)
            _peak_reset(args.device)  # the variant's models are gone with its frame
    for quant, dense in (("nf4", "dense"), ("qlora", "qlora-dense")):
        if quant in results and dense in results:
            results[quant]["agreement_with_" + dense] = agree = agreement(results[quant], results[dense])
            print(f"[{quant} vs {dense}] top-1 agree {agree['top1_agree']:.3f}, mean |d log p| "
                  f"{agree['mean_abs_dlogprob']:.4f}", flush=True)
    if args.json is not None:
        clean = {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")} for k, v in results.items()}
        args.json.write_text(json.dumps({"model": args.model, "device": args.device, "dtype": args.dtype,
                                         "prompts": args.prompts, "results": clean}, indent=1, default=str))


if __name__ == "__main__":
    main()
