#!/usr/bin/env bash
# Session 22, H100 run 22 call 2 (<= 560 s): the grouped-matmul table's Mixtral rows with the new
# default (the weight multicast where an expert's K * N >= 32 Mi elements: Mixtral's products
# only; DeepSeek's and Qwen3's kernels are run 18's), settled, public bench: balanced with torch,
# jaxmoe, jaxmoe_triton interleaved; skewed with torch, jaxmoe (as run 18's table).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s22c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 300 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton --routings balanced \
  --shapes mixtral-up,mixtral-down --out-dir $W --stem gemm-balanced-mixtral --time-budget-s 280 \
  > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 240 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --shapes mixtral-up,mixtral-down --out-dir $W --stem gemm-skewed-mixtral --time-budget-s 220 \
  > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -30
tar czf "$OUT/call.tgz" -C $W .
