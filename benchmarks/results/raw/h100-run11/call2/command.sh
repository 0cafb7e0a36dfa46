#!/usr/bin/env bash
# Session 10, H100 call 2 (<= 560 s): the Pallas columnwise quantizer against XLA (bits, time);
# the FP8 layer with the FP8 wgrad on it (per step and cached) against torch and FP8 with the
# bf16 wgrad, Mixtral and DeepSeek, fwd and fwd+bwd; Mixtral's fwd+bwd kernel profile.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s10c2; rm -rf $W; mkdir -p $W
timeout 80 python3 benchmarks/fp8_columnwise_bench.py --out $W/columnwise.json > $W/columnwise.log 2>&1; echo "columnwise rc=$?"
tail -14 $W/columnwise.log
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 80 python3 benchmarks/layer_profile.py \
  --presets mixtral --passes fwd+bwd --fp8-recipe rowwise --fp8-wgrad fp8 --out-dir $W > $W/profile.log 2>&1; echo "profile rc=$?"
grep -a -E "^###|^\| " $W/profile.log | head -26
timeout 360 python3 -m jaxmoe bench layer --preset mixtral,dsv3 \
  --impls torch,jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-fp8wgrad,jaxmoe-fp8-rowwise-fp8wgrad-cached \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|rror|skipped" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
