#!/usr/bin/env bash
# Session 16, H100 run 17 call 3 (<= 560 s): the rest of the grouped-matmul table, settled, with
# the public bench: Qwen3 down balanced (call 2's budget ran out before it), then the six shapes
# skewed (Dirichlet 0.3), torch / jaxmoe interleaved (jaxmoe_triton left out: device time).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s16c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 90 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton --routings balanced \
  --shapes qwen3-down --out-dir $W --stem gemm-balanced-qwen3-down --time-budget-s 80 > $W/gemm-balanced.log 2>&1
echo "balanced rc=$?"
timeout 450 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --out-dir $W --stem gemm-skewed --time-budget-s 420 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -40
tar czf "$OUT/call.tgz" -C $W .
