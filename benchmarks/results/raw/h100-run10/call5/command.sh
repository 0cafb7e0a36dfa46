#!/usr/bin/env bash
# Session 9, H100 call 5 (<= 590 s): the layer table: torch, torchtitan 0.3.0 (carried wheels),
# jaxmoe bf16 and FP8 rowwise (per step, and with the weights quantized once per step), three
# presets, fwd and fwd+bwd, interleaved rounds.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c5; rm -rf $W /tmp/site; mkdir -p $W
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 560 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe,jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-cached \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -32
tar czf "$OUT/call.tgz" -C $W .
