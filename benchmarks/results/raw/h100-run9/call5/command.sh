#!/usr/bin/env bash
# Session 8, H100 call 5 (<= 595 s): the grouped-matmul table with the current default ('auto':
# Mosaic fwd/dgrad, the cross-tile Mosaic wgrad everywhere), torch interleaved per case:
# balanced, then skewed (Dirichlet 0.3).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 300 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 285 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 280 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --out-dir $W --stem gemm-skewed --time-budget-s 265 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | tail -50
tar czf "$OUT/call.tgz" -C $W .
