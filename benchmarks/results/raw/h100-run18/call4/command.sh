#!/usr/bin/env bash
# Session 18, H100 run 18 call 4 (<= 590 s): the grouped-matmul table's last balanced cases (call
# 3's budget ran out: Qwen3 up fwd+bwd, Qwen3 down), then the layer table with this session's
# default (tiles from each group's first row), settled: torch / torchtitan / jaxmoe.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c4; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
PYTHONPATH=src timeout 120 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton \
  --routings balanced --shapes qwen3-up,qwen3-down --out-dir $W --stem gemm-balanced-qwen3 \
  --time-budget-s 110 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
tr '\r' '\n' < $W/gemm-balanced.log | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -14
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 440 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
