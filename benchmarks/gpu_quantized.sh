#!/usr/bin/env bash
# The quantized / QLoRA figures of benchmarks/RESULTS.md on one GPU (under 8 minutes on an H100/H200):
# bench_quantized.py on random:llama-3.2-1b (32 prompts, all four variants, torch.compile of the
# grafted pass; 512 prompts, dense vs nf4) and random:llama-3.1-8b (32 prompts, QLoRA vs its dense
# pair). Logs and JSON go to ${OUT:-/tmp/gpu_quantized}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_quantized}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, transformers, bitsandbytes; print('torch', torch.__version__, 'transformers', transformers.__version__, 'bitsandbytes', bitsandbytes.__version__)" | tee -a "$OUT/gpu.txt"
step() {  # step SECONDS NAME ARGS...: one bench_quantized.py run, its own time limit and log
    local limit=$1 name=$2; shift 2
    echo "== $name: $*"
    timeout "$limit" $PY benchmarks/bench_quantized.py --device cuda --dtype bfloat16 --json "$OUT/$name.json" "$@" 2>&1 \
        | grep -v "Loading weights\|Writing model shards\|Graph break\|_dynamo" | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}"
}
step 200 q1b_32 --model random:llama-3.2-1b --prompts 32 --compile
step 90 q1b_512 --model random:llama-3.2-1b --prompts 512 --batch-size 256 --variants dense,nf4 --repeats 2
step 200 q8b_32 --model random:llama-3.1-8b --prompts 32 --variants qlora-dense,qlora
