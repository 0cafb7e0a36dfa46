#!/usr/bin/env bash
# Session 12, H100 call 7 (<= 420 s): the FP8 layer with FP8 weight gradients on the new FP8
# wgrad default (4 ring slots, 64-row halves; call 6), next to FP8 with bf16 wgrads and torch,
# interleaved, fwd+bwd; weights cast in every call, as run 11 measured them.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c7; rm -rf $W; mkdir -p $W
timeout 390 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 --passes fwd+bwd \
  --impls torch,jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-fp8wgrad --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped|usage|error" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
