#!/usr/bin/env bash
# Session 9, H100 call 4 (<= 590 s): the bf16 grouped-matmul table's Mixtral and DeepSeek rows
# with the current default (forward/dgrad and wgrad on the ring), balanced then skewed
# (Dirichlet 0.3), torch interleaved. (The Qwen3 rows: call 2 and run 9 call 9.)
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c4; rm -rf $W; mkdir -p $W
S=mixtral-up,mixtral-down,dsv3-up,dsv3-down
timeout 285 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced --shapes $S \
  --out-dir $W --stem gemm-balanced --time-budget-s 270 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 285 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed --shapes $S \
  --out-dir $W --stem gemm-skewed --time-budget-s 270 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | grep -v "^TFLOP" | tail -36
tar czf "$OUT/call.tgz" -C $W .
