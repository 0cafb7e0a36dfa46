#!/usr/bin/env bash
# Session 18, H100 run 18 call 3 (<= 590 s): the grouped-matmul table, settled, public bench, the
# new default (tiles from each group's first row): Qwen3 down skewed (call 2's budget ran out
# before it), then the balanced half, torch / jaxmoe / jaxmoe_triton interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 80 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --shapes qwen3-down --out-dir $W --stem gemm-skewed-qwen3-down --time-budget-s 70 \
  > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
timeout 490 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 470 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
cat $W/gemm-skewed.log $W/gemm-balanced.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -45
tar czf "$OUT/call.tgz" -C $W .
