#!/usr/bin/env bash
# Session 8, H100 call 9 (<= 590 s): with the new default forward/dgrad tiles (the hand-written
# ring + the swizzled epilogue): the balanced gemm table (torch interleaved), then the layer
# (torch and jaxmoe interleaved) on the three presets.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w9; rm -rf $W; mkdir -p $W
timeout 315 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 300 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
tr '\r' '\n' < $W/gemm-balanced.log | grep -a -E "TFLOP/s|ERROR|budget" | tail -26
timeout 255 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 --impls torch,jaxmoe \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -14
tar czf "$OUT/call.tgz" -C $W .
