#!/usr/bin/env bash
# Session 11, H100 call 2 (<= 590 s): the gemm table with the new default wgrad tiles (4-slot
# ring, 64-row epilogue halves): all six shapes balanced, then skewed Qwen3; torch and jaxmoe
# (auto) in interleaved rounds.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s11c2; rm -rf $W; mkdir -p $W
timeout 400 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 385 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 175 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed --shapes qwen3-up,qwen3-down \
  --out-dir $W --stem gemm-skewed-qwen3 --time-budget-s 165 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | grep -v "^TFLOP" | tail -36
tar czf "$OUT/call.tgz" -C $W .
