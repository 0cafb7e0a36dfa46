#!/usr/bin/env bash
# Session 10, H100 call 3 (<= 560 s): the FP8 wgrad kernel on all six shapes, balanced and
# skewed (checks and timing; the probe's operands now from quantize_columnwise); the Qwen3
# layer with the FP8 wgrad against torch and FP8 with the bf16 wgrad.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s10c3; rm -rf $W; mkdir -p $W
timeout 300 python3 benchmarks/fp8_wgrad_probe.py --out-dir $W > $W/wgrad.log 2>&1; echo "wgrad rc=$?"
grep -a "^|" $W/fp8-wgrad-probe.md | head -45
timeout 200 python3 -m jaxmoe bench layer --preset qwen3 \
  --impls torch,jaxmoe,jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-fp8wgrad,jaxmoe-fp8-rowwise-fp8wgrad-cached \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|rror|skipped" | grep -v "bench layer" | tail -12
tar czf "$OUT/call.tgz" -C $W .
