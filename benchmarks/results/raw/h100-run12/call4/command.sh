#!/usr/bin/env bash
# Session 11, H100 call 4 (<= 400 s): the gemm rows of call 2 below 1.0x measured again with the
# sample sizes from the fastest of three probe calls (call 2 sized jaxmoe's skewed Qwen3-up
# forward samples at 6 calls against torch's 42): balanced Mixtral down and Qwen3 down, skewed
# Qwen3; torch interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s11c4; rm -rf $W; mkdir -p $W
timeout 200 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --shapes mixtral-down,qwen3-down --out-dir $W --stem gemm-balanced --time-budget-s 190 \
  > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 175 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --shapes qwen3-up,qwen3-down --out-dir $W --stem gemm-skewed-qwen3 --time-budget-s 165 \
  > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | grep -v "^TFLOP" | tail -16
tar czf "$OUT/call.tgz" -C $W .
