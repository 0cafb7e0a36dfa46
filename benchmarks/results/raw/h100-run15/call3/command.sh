#!/usr/bin/env bash
# Session 14, H100 run 15 call 3 (<= 200 s): the gemm table's closest balanced cases (run 14:
# 1.00-1.01x) again with each peer settled for 500 ms before each sample (the bench's new
# default on a GPU): Mixtral down, DeepSeek up, Mixtral up; fwd and fwd+bwd.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s14c3; rm -rf $W; mkdir -p $W
timeout 190 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --shapes mixtral-down,dsv3-up,mixtral-up --out-dir $W --stem gemm-settled \
  --time-budget-s 150 > $W/gemm-settled.log 2>&1; echo "gemm rc=$?"
tr '\r' '\n' < $W/gemm-settled.log | grep -a -E "TFLOP/s|ERROR|budget" | grep -v "^TFLOP" | tail -14
tar czf "$OUT/call.tgz" -C $W .
