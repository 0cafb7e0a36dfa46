#!/usr/bin/env bash
# Session 8, H100 call 7 (<= 300 s): the gemm table's Qwen3 rows that call 5's time budget cut
# (qwen3-down balanced; qwen3-up and qwen3-down skewed), same code, torch interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w7; mkdir -p $W
timeout 120 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced --shapes qwen3-down \
  --out-dir $W --stem gemm-balanced-qwen3 --time-budget-s 110 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 170 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed --shapes qwen3-up,qwen3-down \
  --out-dir $W --stem gemm-skewed-qwen3 --time-budget-s 160 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | tail -14
tar czf "$OUT/call.tgz" -C $W .
