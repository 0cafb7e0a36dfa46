#!/usr/bin/env bash
# Session 7, H100 call 7 (<= 585 s): the grouped-matmul table with the current default ('auto':
# Mosaic fwd/dgrad, Mosaic wgrad where min(K, N) > 1024), torch interleaved per case: balanced,
# then skewed (Dirichlet 0.3) as far as the budget goes.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 300 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 280 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 270 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --out-dir $W --stem gemm-skewed --time-budget-s 245 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR" | tail -48
tar czf "$OUT/call.tgz" -C $W .
