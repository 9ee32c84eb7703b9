#!/usr/bin/env bash
# Exact single cells on a GPU, prefix sharing vs depth sharing side by side (float32: half
# precision runs rows whole on both paths), and `weightgraft check` on the card (float64, the
# depth-sharing case included). Logs go to ${OUT:-/tmp/gpu_depth}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_depth}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for sharing in prefix depth; do
    echo "== exact cells, $sharing sharing"
    timeout 110 $PY benchmarks/bench_exact_cells.py --model random:llama-3.2-1b --device cuda --dtype float32 \
        --prompts 8 --cells 0 --sharing "$sharing" 2>&1 | tee "$OUT/exact_cells_$sharing.log"
done
echo "== weightgraft check on the card (float64)"
timeout 120 $PY -m weightgraft check random:smollm2-135m random:smollm2-135m@1 --device cuda 2>&1 | tail -25 | tee "$OUT/check.log"
