"""What the CPU's instruction set changes in a model's numbers: SmolLM2-135M's next-token logits
on 8 prompts, loaded as float32, bfloat16, nf4, int8 and torchao-int8, each computed in a fresh
process under settings that make this CPU run the kernels another CPU family would run, and
compared with this machine's own default kernels (max |Δ logit|, top-1 agreement).

    python benchmarks/bench_cpu_paths.py [--loads float32,bfloat16,nf4,int8,torchao-int8]

The settings (environment variables read once at start-up by torch, oneDNN and MKL):
- ``ATEN_CPU_CAPABILITY=avx2``: torch's own vectorized kernels (norms, softmax, elementwise,
  torchao's ``_weight_int8pack_mm``) at AVX2, as on a CPU without AVX-512;
- ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: oneDNN without AVX512-BF16/AMX (a Xeon without them): the
  bfloat16 matmuls' path;
- ``MKL_ENABLE_INSTRUCTIONS=AVX2``: MKL's float32 GEMM at AVX2;
- all three together: an AVX2-only CPU;
- ``bnb repack``: bitsandbytes' AVX512-BF16 repack of 4-bit layers left on (what weightgraft turns
  off: ``weightgraft.engine.precision.one_cpu_path``), only where this CPU has AVX512-BF16.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = [
    "The capital of France is", "Keanu Reeves starred in a movie with", "The largest planet in the solar system is",
    "Q: Who wrote Hamlet? A:", "Water boils at a temperature of", "The chemical symbol for gold is",
    "In 1969, the first person to walk on the Moon was", "The opposite of hot is",
]

WORKLOAD = r"""
import sys, warnings, torch
warnings.simplefilter("ignore")
import weightgraft as wg
load, out, repack = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
kwargs = {"dtype": torch.bfloat16} if load == "bfloat16" else ({} if load == "float32" else {"quantization": load})
model, tok = wg.load("smollm2-135m", **kwargs)
if repack:
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = True
prompts = PROMPTS
with torch.no_grad():
    logits = torch.stack([model(**tok([p], return_tensors="pt")).logits[0, -1].float() for p in prompts])
torch.save({"logits": logits, "capability": torch.backends.cpu.get_cpu_capability()}, out)
"""

SETTINGS: dict[str, dict[str, str]] = {
    "this CPU (default)": {},
    "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "ONEDNN_MAX_CPU_ISA=AVX512_CORE": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "MKL_ENABLE_INSTRUCTIONS=AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "all three at AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def _has_avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _run(load: str, env: dict[str, str], out: Path, repack: bool = False) -> dict:
    import torch

    script = WORKLOAD.replace("PROMPTS", json.dumps(PROMPTS))
    subprocess.run([sys.executable, "-c", script, load, str(out), "1" if repack else "0"],
                   env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **env},
                   check=True, capture_output=True)
    return torch.load(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="float32,bfloat16,nf4,int8,torchao-int8")
    args = parser.parse_args()
    loads = args.loads.split(",")
    bf16_cpu = _has_avx512_bf16()
    print(f"CPU has AVX512-BF16: {bf16_cpu}")
    print("| load | setting | torch capability | max abs diff in logits | top-1 agreement |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for load in loads:
            ref = None
            settings = list(SETTINGS.items())
            if load in ("nf4", "fp4") and bf16_cpu:
                settings.append(("bnb repack (old behaviour)", {}))
            for i, (name, env) in enumerate(settings):
                got = _run(load, env, Path(tmp) / f"{load}-{i}.pt", repack=name.startswith("bnb repack"))
                if ref is None:
                    ref = got
                diff = (got["logits"] - ref["logits"]).abs().max().item()
                agree = (got["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean().item()
                print(f"| {load} | {name} | {got['capability']} | {diff:.2e} | {agree:.0%} |", flush=True)


if __name__ == "__main__":
    main()
