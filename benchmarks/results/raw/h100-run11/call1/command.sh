#!/usr/bin/env bash
# Session 10, H100 call 1 (<= 590 s): the FP8 wgrad kernel's first GPU run (checks and timing
# against the bf16 Mosaic wgrad and torch's, six shapes, balanced and skewed); the layer with
# Fp8Recipe(wgrad="fp8") (per step and cached) against torch, jaxmoe bf16 and FP8 with the bf16
# wgrad (now with the activation cast before the permutation), three presets; its profile.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s10c1; rm -rf $W; mkdir -p $W
timeout 170 python3 benchmarks/fp8_wgrad_probe.py --out-dir $W > $W/wgrad.log 2>&1; echo "wgrad rc=$?"
tail -30 $W/wgrad.log
timeout 300 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,jaxmoe,jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-fp8wgrad,jaxmoe-fp8-rowwise-fp8wgrad-cached \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|rror|skipped" | grep -v "bench layer" | tail -36
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 100 python3 benchmarks/layer_profile.py \
  --presets mixtral --passes fwd+bwd --fp8-recipe rowwise --fp8-wgrad fp8 --out-dir $W > $W/profile.log 2>&1; echo "profile rc=$?"
grep -a -E "^###|^\| " $W/profile.log | head -40
tar czf "$OUT/call.tgz" -C $W .
