#!/usr/bin/env bash
# Session 7, H100 call 3 (<= 580 s): the grouped-matmul table, balanced, six shapes, torch and
# jaxmoe timed in interleaved rounds per case (call 2's jaxmoe fwd+bwd rows were timed one call
# per sample by a bug, fixed).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 560 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 500 > $W/gemm.log 2>&1; echo "gemm rc=$?"
grep -a -E "TFLOP/s|ERROR|budget" $W/gemm.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | tail -26
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
tar czf "$OUT/call.tgz" -C $W .
