#!/usr/bin/env bash
# Session 16, H100 run 17 call 5 (<= 160 s): the grouped-matmul table's last cases, settled, public
# bench: Qwen3 down, balanced and skewed, fwd and fwd+bwd, torch / jaxmoe interleaved (calls 2-3
# ran out of time before them).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s16c5; rm -rf $W; mkdir -p $W
timeout 150 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced,skewed \
  --shapes qwen3-down --out-dir $W --stem gemm-qwen3-down --time-budget-s 140 > $W/gemm.log 2>&1
echo "qwen3-down rc=$?"
tr '\r' '\n' < $W/gemm.log | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -12
tar czf "$OUT/call.tgz" -C $W .
