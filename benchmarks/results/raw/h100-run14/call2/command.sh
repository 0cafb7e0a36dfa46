#!/usr/bin/env bash
# Session 13, H100 call 2 (<= 590 s): the gemm table again on the current default (the Mosaic
# gmm's epilogue became per-slab in session 12 and gained the ping-pong branch in session 13;
# run 12 measured the table before both): six shapes balanced, then skewed Qwen3.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s13c2; rm -rf $W; mkdir -p $W
timeout 400 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 385 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 175 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed --shapes qwen3-up,qwen3-down \
  --out-dir $W --stem gemm-skewed-qwen3 --time-budget-s 165 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | grep -v "^TFLOP" | tail -36
tar czf "$OUT/call.tgz" -C $W .
