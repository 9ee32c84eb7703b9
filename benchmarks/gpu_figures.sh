#!/usr/bin/env bash
# The GPU figures of benchmarks/RESULTS.md in one run (under 10 minutes on one H100/H200):
# the engine vs plain forward vs the per-token method (bench_engine.py, bench_paper_scale.py) on
# random:llama-3.2-1b and random:llama-3.1-8b in bfloat16, and exact single cells
# (bench_exact_cells.py, depth vs prefix sharing in float32). Logs and the paper-scale section go to ${OUT:-/tmp/gpu_figures}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_figures}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
step() {  # step SECONDS NAME COMMAND...: one benchmark, its own time limit, its own log
    local limit=$1 name=$2; shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}"
}
for sharing in depth prefix; do  # float32: half precision runs rows whole on both paths
    step 60 "exact_cells_1b_$sharing" $PY benchmarks/bench_exact_cells.py --model random:llama-3.2-1b --device cuda \
        --dtype float32 --prompts 4 --cells 200 --sharing "$sharing"
done
step 80 engine_1b $PY benchmarks/bench_engine.py --model random:llama-3.2-1b --donor random:llama-3.2-1b@1 \
    --n 64 --per-token-items 8 --device cuda --dtype bfloat16
step 110 paper_scale_1b $PY benchmarks/bench_paper_scale.py --models llama-3.2-1b --device cuda --dtype bfloat16 \
    --prompts 32 --per-token-rows 1 --results "$OUT/paper_scale_1b.md"
step 180 paper_scale_8b $PY benchmarks/bench_paper_scale.py --models llama-3.1-8b --device cuda --dtype bfloat16 \
    --prompts 32 --per-token-rows 1 --results "$OUT/paper_scale_8b.md"
