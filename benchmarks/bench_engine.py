"""Benchmark: the per-token method vs the one-pass engine vs plain forward passes.

In ONE run, on the same model, prompts and schemes, times
  (a) the per-token definition (``weightgraft.engine.reference.per_token_forward``: per position a
      model holding that position's weights, one-token forward with the KV cache),
  (b) ``graft_forward`` batched over examples x schemes,
  (c) plain batched forward passes of the base model over the same sequences,
and prints wall times, ratios and peak memory. The per-token method is slow, so it is timed
on a subset and compared per (example, scheme) item. The last line reads
``speedup_vs_per_token=<a/b> overhead_vs_plain=<b/c>``. Models, schemes and source maps come
through the public API (``wg.load``, ``wg.presets``, ``wg.graft``'s ``source``); the timed
calls are ``wg.graft_forward``, the runner's ``prefix_forward`` and the per-token reference.

    python benchmarks/bench_engine.py                      # embedded SmolLM2-135M, CPU
    python benchmarks/bench_engine.py --n 20 --per-token-items 8 --device cuda --dtype bfloat16
    python benchmarks/bench_engine.py --model random:llama-3.2-1b --donor random:llama-3.2-1b@1 \
        --device cuda --dtype bfloat16       # a random: model (no tokenizer): random-id prompts
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

import weightgraft as wg
from weightgraft.data.prompts import load_test_prompts
from weightgraft.engine.reference import CompositeModel, per_token_forward
from weightgraft.engine.sharing.prefix import GraftItem, prefix_forward
from weightgraft.engine.source_map import SourceMap


class PeakMemory:
    """Peak resident memory (CPU, sampled) or peak allocated memory (CUDA) during a block."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = self._rss()
            self.peak = self.base
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._rss())

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def perturbed_copy(model: torch.nn.Module, scale: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """A stand-in for a finetuned donor when none is given (same shapes, other weights)."""
    donor = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    for p in donor.parameters():
        p.add_(scale * p.float().std() * torch.randn(p.shape, generator=gen).to(p.dtype).to(p.device))
    return donor


def left_padded(items, pad_id: int):
    seq = max(len(ex.input_ids) for ex, _ in items)
    n_slots = next(iter(items[0][0].sources.values())).shape[1]
    ids = torch.full((len(items), seq), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    source = torch.zeros((len(items), seq, n_slots), dtype=torch.long)
    for b, (ex, scheme) in enumerate(items):
        n = len(ex.input_ids)
        ids[b, seq - n :] = torch.tensor(ex.input_ids)
        mask[b, seq - n :] = 1
        source[b, seq - n :] = ex.sources[scheme]
    return ids, mask, source


def scheme_sources(models: dict, tok, prompts, schemes) -> tuple[list[SimpleNamespace], int]:
    """Per prompt, its token ids and one source map per scheme, as ``wg.graft`` places them
    (the maps it ran, from ``GraftOutput.source``). A prompt some scheme cannot place is left
    out of all of them; returns the examples and how many were left out."""
    spans = [{k: v for k, v in p.spans.items() if k != p.answer_field} for p in prompts]
    keep = list(range(len(prompts)))
    for scheme in schemes:  # a cheap pass per prompt only when a whole batch is refused
        try:
            wg.graft(models, tok, [prompts[i].prompt for i in keep], scheme, spans=[spans[i] for i in keep])
        except wg.GraftInputError:
            keep = [i for i in keep if _placeable(models, tok, prompts[i].prompt, scheme, spans[i])]
    examples = [SimpleNamespace(input_ids=None, sources={}) for _ in keep]
    for scheme in schemes:
        out = wg.graft(models, tok, [prompts[i].prompt for i in keep], scheme, spans=[spans[i] for i in keep])
        for ex, ids, mask, source in zip(examples, out.input_ids, out.attention_mask, out.source):
            real = mask.bool()
            ex.input_ids = ids[real].tolist()
            ex.sources[scheme.name] = source[real]
    return examples, len(prompts) - len(keep)


def _placeable(models: dict, tok, prompt: str, scheme, spans: dict) -> bool:
    try:
        wg.graft(models, tok, [prompt], scheme, spans=[spans])
    except wg.GraftInputError:
        return False
    return True


def random_id_examples(base: torch.nn.Module, n: int) -> tuple[list, list[SimpleNamespace]]:
    """The position family's schemes and ``n`` examples of 10-25 random token ids with the first
    entity at tokens 1-3, placed as bench_paper_scale places them (for models without a tokenizer)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_paper_scale", Path(__file__).with_name("bench_paper_scale.py"))
    paper_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paper_scale)
    prompts = paper_scale._prompts(n, base.config.vocab_size, 0)
    schemes, items, _ = paper_scale._position_items(base, prompts)
    examples = []
    for i in range(len(prompts)):
        group = items[i * len(schemes) : (i + 1) * len(schemes)]
        examples.append(SimpleNamespace(input_ids=list(group[0].input_ids),
                                        sources={s.name: it.maps.slots for s, it in zip(schemes, group)}))
    return schemes, examples


def build_prompts(n: int, seed: int, template: str):
    from weightgraft.data import build_dataset

    out = Path(tempfile.mkdtemp(prefix="wg-bench-"))
    build_dataset("fake_movies_real_actors", n=n, seed=seed, out=out)
    return [p for p in load_test_prompts(out) if p.template == template and p.direction == "a2b"][:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="base model spec")
    ap.add_argument("--donor", default=None, help="donor spec (default: a perturbed copy of the base)")
    ap.add_argument("--data", type=Path, default=None, help="dataset dir (default: build fake_movies_real_actors)")
    ap.add_argument("--n", type=int, default=100, help="relations (examples)")
    ap.add_argument("--template", default="headline")
    ap.add_argument("--preset", default="position")
    ap.add_argument("--per-token-items", type=int, default=16, help="(example, scheme) items timed per token")
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    base, tok = wg.load(args.model, device=args.device, dtype=dtype)
    donor = (wg.load(args.donor, device=args.device, dtype=dtype)[0] if args.donor
             else perturbed_copy(base))
    models = [base, donor]
    if tok is None:  # a random: model has no tokenizer: the paper's prompt lengths as random ids
        if args.preset != "position":
            raise SystemExit("a random: model is measured on the position family only (--preset position)")
        schemes, examples = random_id_examples(base, args.n)
        excluded = 0
    else:
        if args.data is not None:
            prompts = [p for p in load_test_prompts(args.data) if p.template == args.template][: args.n]
        else:
            prompts = build_prompts(args.n, 0, args.template)
        schemes = wg.presets.preset(args.preset)
        examples, excluded = scheme_sources({"pre": base, "sft": donor}, tok, prompts, schemes)
    items = [(ex, s.name) for ex in examples for s in schemes]
    lengths = [len(ex.input_ids) for ex in examples]
    print(f"model={args.model} device={args.device} dtype={args.dtype} threads={torch.get_num_threads()}")
    print(f"examples={len(examples)} (excluded {excluded}) schemes={len(schemes)} "
          f"items={len(items)} tokens/prompt={min(lengths)}-{max(lengths)} batch={args.batch_size}")
    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else 0
    batches = [left_padded(items[i : i + args.batch_size], pad) for i in range(0, len(items), args.batch_size)]

    with torch.no_grad():  # warm-up (allocator, kernels)
        ids, mask, source = batches[0]
        wg.graft_forward(models, ids[:2], source[:2], attention_mask=mask[:2])

    # (a) the per-token method on a subset, as the paper describes it (a fresh model copy per
    # position); (a') the same definition reloading only the slots that change.
    subset = items[: args.per_token_items]

    def per_token(copy_per_position: bool):
        composite = CompositeModel(models)
        with PeakMemory(args.device) as mem:
            _sync(args.device)
            t0 = time.perf_counter()
            for ex, scheme in subset:
                ids = torch.tensor([ex.input_ids], device=args.device)
                per_token_forward(models, ids, ex.sources[scheme][None].to(args.device),
                                  composite=composite, copy_per_position=copy_per_position)
            _sync(args.device)
            return time.perf_counter() - t0, mem

    time_a, mem_a = per_token(copy_per_position=True)
    time_a2, mem_a2 = per_token(copy_per_position=False)
    per_item_a = time_a / len(subset)

    def timed(fn):
        with PeakMemory(args.device) as mem, torch.no_grad():
            _sync(args.device)
            t0 = time.perf_counter()
            for ids, mask, source in batches:
                fn(ids, mask, source)
            _sync(args.device)
            return time.perf_counter() - t0, mem

    def last(ids: torch.Tensor) -> torch.Tensor:
        return torch.full((ids.shape[0], 1), ids.shape[1] - 1, dtype=torch.long)
    # (b) the engine, logits only where they are scored (the last position)
    time_b, mem_b = timed(lambda ids, mask, source: wg.graft_forward(
        models, ids, source, attention_mask=mask, logit_positions=last(ids)))
    # (b') the runner's default: prefix_forward, positions shared by a batch's rows computed once
    graft_items = [GraftItem(ex.input_ids, SourceMap(ex.sources[scheme])) for ex, scheme in items]
    item_batches = [graft_items[i : i + args.batch_size] for i in range(0, len(graft_items), args.batch_size)]
    with PeakMemory(args.device) as mem_b2, torch.no_grad():
        _sync(args.device)
        t0 = time.perf_counter()
        for chunk in item_batches:
            prefix_forward(models, chunk, pad)
        _sync(args.device)
        time_b2 = time.perf_counter() - t0
    # (c) plain forward passes of the base model over the same sequences
    def plain(ids, mask, source):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        models[0](input_ids=ids.to(args.device), attention_mask=mask.to(args.device),
                  position_ids=pos.to(args.device), logits_to_keep=1, use_cache=False)
    time_c, mem_c = timed(plain)

    per_item_b, per_item_c = time_b / len(items), time_c / len(items)
    a_over_b, b_over_c = per_item_a / per_item_b, time_b / time_c
    print(f"(a) per-token, copy/position: {time_a:8.2f} s for {len(subset)} items = {per_item_a:.4f} s/item  "
          f"peak +{mem_a.extra_mib:.0f} MiB")
    print(f"(a') per-token, reload slots: {time_a2:8.2f} s for {len(subset)} items = "
          f"{time_a2 / len(subset):.4f} s/item  peak +{mem_a2.extra_mib:.0f} MiB  "
          f"(speedup of (b) over it: {time_a2 / len(subset) / (time_b / len(items)):.1f})")
    print(f"(b) graft_forward batched:    {time_b:8.2f} s for {len(items)} items = {per_item_b:.4f} s/item  "
          f"peak +{mem_b.extra_mib:.0f} MiB")
    print(f"(b') prefix_forward batched:  {time_b2:8.2f} s for {len(items)} items = {time_b2 / len(items):.4f} s/item  "
          f"peak +{mem_b2.extra_mib:.0f} MiB  (speedup over (a): {per_item_a / (time_b2 / len(items)):.1f}, "
          f"vs plain: {time_b2 / time_c:.2f}; the runner's default)")
    print(f"(c) plain forward:            {time_c:8.2f} s for {len(items)} items = {per_item_c:.4f} s/item  "
          f"peak +{mem_c.extra_mib:.0f} MiB")
    print(f"ratios compare time per (example, scheme) item; (a) timed on {len(subset)} of {len(items)} items")
    print(f"speedup_vs_per_token={a_over_b:.1f} overhead_vs_plain={b_over_c:.2f}")


if __name__ == "__main__":
    main()
