#!/usr/bin/env bash
# Session 7, H100 call 5 (<= 580 s): the FP8 layer with and without the separate K-major weight
# pass; the Mosaic wgrad against Triton's on skewed groups (fwd+bwd); the bf16 layer after the
# loop-free searches.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 170 python3 benchmarks/fp8_layer_probe.py --out-dir $W 2>&1 | grep -v Warn | tail -12
timeout 200 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_pallas --routings skewed \
  --pass fwd+bwd --out-dir $W --stem gemm-skewed-wgrad --time-budget-s 175 > $W/gemm.log 2>&1
echo "gemm rc=$?"; tr '\r' '\n' < $W/gemm.log | grep -a -E "TFLOP/s|ERROR" | tail -18
timeout 190 python3 -m jaxmoe bench layer --preset all --impls torch,jaxmoe --out $W/layer.json \
  > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms " | grep -v "bench layer" | tail -12
tar czf "$OUT/call.tgz" -C $W .
