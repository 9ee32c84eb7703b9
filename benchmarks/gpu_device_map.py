"""Models spread by a ``device_map`` graft exactly: dense and LoRA donors, layers split between
``cuda:0`` and ``cpu`` (a stand-in for two devices: every cross-device path runs), against the
per-token definition (``weightgraft.engine.reference.per_token_forward``).

Tiny random models (Llama: GQA; Phi-3: fused qkv and gate_up, so column splits; GPT-2: Conv1D,
tied embeddings), no downloads. accelerate's ``dispatch_model`` places them (``main_device="cpu"``,
so "cpu" layers run on the CPU rather than being offloaded): embeddings on the first device, the
blocks alternating, the final norm on the second device and the unembedding on the first (tied
embeddings stay together). The definition runs on the models before placement, on the CPU.
Prints the worst |difference| of the logits per case; exits 1 on any beyond tolerance: 1e-10
in float64 (as the LoRA tests); in float32 2e-5 of the logit scale (as the quantized tests: an
unmerged adapter and the merged definition round differently, and 4 layers amplify it).
Without CUDA the same checks run with a cpu/cpu split (hooks forced), so it is tested anywhere.

    PYTHONPATH=src python3 benchmarks/gpu_device_map.py            # < 60 s on one GPU
    PYTHONPATH=src python3 benchmarks/gpu_device_map.py --cpu      # the cpu/cpu split
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers as T
from accelerate import dispatch_model
from torch import nn

import weightgraft as wg
from weightgraft.engine import lora
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward

_COMMON = dict(vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_SIZES = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4)
CONFIGS = {
    "llama": lambda: T.LlamaConfig(**_SIZES, num_key_value_heads=2, **_COMMON),
    "phi3": lambda: T.Phi3Config(**_SIZES, num_key_value_heads=2, **_COMMON),
    "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=4, n_head=4, n_positions=64, **_COMMON),
}
LORA_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}  # float32: relative to max(1, max |logit|)


@torch.no_grad()
def tiny(arch: str, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A tiny model with large random weights (grafting any slot moves the logits)."""
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(CONFIGS[arch]())
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if p.dim() == 1:
            p.copy_(1 + 0.3 * noise if name.endswith("weight") else 0.3 * noise)
        else:
            p.copy_(noise / p.shape[-1] ** 0.5)
    return model.to(dtype).eval()


@torch.no_grad()
def dense_donor(base: nn.Module, seed: int = 1) -> nn.Module:
    donor = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(seed)
    for p in donor.parameters():
        p.add_(0.5 * p.double().std().to(p.dtype) * torch.randn(p.shape, generator=gen).to(p.dtype))
    return donor


@torch.no_grad()
def lora_adapter(base: nn.Module, arch: str, out: Path) -> nn.Module:
    """Save a random LoRA adapter of ``base`` in ``out``; return a separate merged copy."""
    from peft import LoraConfig, get_peft_model

    pm = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS[arch]))
    gen = torch.Generator().manual_seed(2)
    for name, p in pm.named_parameters():
        if "lora_" in name:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) / p.shape[-1] ** 0.5)
    pm.save_pretrained(out)
    return pm.merge_and_unload().eval()


def split_map(model: nn.Module, first: str, second: str) -> dict[str, str]:
    """Embeddings and the rotary table on ``first``, blocks alternating, the final norm on
    ``second``, the unembedding on ``first`` (with the input embedding it is tied to)."""
    prefix = model.base_model_prefix
    placement = {}
    for name, child in getattr(model, prefix).named_children():
        if isinstance(child, nn.ModuleList):
            placement.update({f"{prefix}.{name}.{i}": (first, second)[i % 2] for i in range(len(child))})
        elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            placement[f"{prefix}.{name}"] = second if "norm" in name or name == "ln_f" else first
    placement["lm_head"] = first
    return placement


def batch(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Ids with left and right padding; a random per-cell map and a whole-position map."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (3, 8), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, -1] = 0
    shape = (*ids.shape, len(wg.slots(model)))
    rows = torch.randint(0, 2, ids.shape, generator=gen)[..., None].expand(shape).clone()
    return ids, mask, [torch.randint(0, 2, shape, generator=gen), rows]


def check(arch: str, kind: str, dtype: torch.dtype, first: str, second: str, tmp: Path) -> tuple[float, float]:
    """Worst |graft_forward - per-token definition| over both maps and both model orders, and
    the tolerance it is held to."""
    base = tiny(arch, dtype)
    if kind == "dense":
        other = reference_other = dense_donor(base)
    else:
        reference_other = lora_adapter(base, arch, tmp / f"{arch}-{dtype}")
    ids, mask, sources = batch(base)
    orders = [(0, 1), (1, 0)]
    with torch.no_grad(), float64_exact([base, reference_other]):
        expected = [per_token_forward([(base, reference_other)[i] for i in o], ids, s, attention_mask=mask)
                    for s in sources for o in orders]
    placement = split_map(base, first, second)
    dispatch_model(base, placement, main_device="cpu", force_hooks=True)
    if kind == "dense":
        dispatch_model(other, placement, main_device="cpu", force_hooks=True)
    else:
        other = wg.load_peft(base, tmp / f"{arch}-{dtype}")
        for m in other.modules():  # the adapter sits where its projection does
            if lora.is_lora(m):
                device = next(lora.base_layer(m).parameters()).device
                assert all(p.device == device for n, p in m.named_parameters() if "lora_" in n), m
    devices = {str(p.device) for p in base.parameters()}
    scale = max(e[mask.bool()].abs().max().item() for e in expected)
    tol = TOL[dtype] * (1.0 if dtype == torch.float64 else max(1.0, scale))
    worst = 0.0
    with torch.no_grad(), float64_exact([base, other]):
        for k, (s, o) in enumerate((s, o) for s in sources for o in orders):
            got = wg.graft_forward([(base, other)[i] for i in o], ids, s, attention_mask=mask)
            worst = max(worst, (got.cpu() - expected[k])[mask.bool()].abs().max().item())
        last = (mask * torch.arange(mask.shape[1])).argmax(1, keepdim=True)  # each row's last real token
        kept = wg.graft_forward([base, other], ids, sources[0], attention_mask=mask, logit_positions=last)
        want = expected[0].gather(1, last[..., None].expand(-1, -1, expected[0].shape[-1]))
        worst = max(worst, (kept.cpu() - want).abs().max().item())  # the unembedding's row pre-hook
    print(f"{arch:6s} {kind:5s} {str(dtype).removeprefix('torch.'):8s} on {sorted(devices)}: "
          f"worst |difference| {worst:.3g} (tolerance {tol:.3g}, logit scale {scale:.3g})", flush=True)
    return worst, tol


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="a cpu/cpu split even where CUDA is available")
    parser.add_argument("--arch", nargs="*", default=sorted(CONFIGS), choices=sorted(CONFIGS))
    args = parser.parse_args(argv)
    logging.getLogger("accelerate.big_modeling").setLevel(logging.ERROR)  # "offloaded to the cpu": it is not
    gpu = torch.cuda.is_available() and not args.cpu
    first, second = ("cuda:0", "cpu") if gpu else ("cpu", "cpu")
    print(f"device_map split: {first} / {second}" + (f" ({torch.cuda.get_device_name(0)})" if gpu else
                                                      " (no CUDA: the same checks, hooks forced)"))
    start, failed = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.arch:
            for kind in ("dense", "lora"):
                for dtype in (torch.float64, torch.float32):
                    worst, tol = check(arch, kind, dtype, first, second, Path(tmp))
                    if not worst <= tol:  # a NaN fails too
                        failed.append(f"{arch} {kind} {dtype}")
    print(f"{len(args.arch) * 4 - len(failed)} of {len(args.arch) * 4} cases within tolerance "
          f"in {time.perf_counter() - start:.1f} s" + (f"; MISMATCH: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
