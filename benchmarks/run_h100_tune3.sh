#!/usr/bin/env bash
# nvidia-h100-x1: tile sweep round 3 (qwen3 shapes: block_k, stages, 256-row tiles).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/jaxmoe-h100}
mkdir -p "$OUT"
log="$OUT/tune3.log"
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } >>"$log" 2>&1
timeout 450 python3 benchmarks/grouped_matmul.py --tune 3 --shapes qwen3-up,qwen3-down \
  --repeats 10 --time-budget-s 420 --out-dir "$OUT" --stem sweep3 >>"$log" 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >>"$log" 2>&1
tail -c 8000 "$log"
