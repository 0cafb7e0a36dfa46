#!/usr/bin/env bash
# Session 9, H100 call 3 (<= 590 s): the FP8 layer with the Pallas weight quantizer (both
# operands in two passes, saved for the dgrad) and with the weights quantized once per step
# (jaxmoe-fp8-rowwise-cached), against torch and the bf16 layer, Mixtral and DeepSeek; the
# weight quantizer's bitwise check and timing at this commit; the FP8 layer's kernel profile.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c3; rm -rf $W; mkdir -p $W
timeout 100 python3 benchmarks/fp8_weight_quantize_bench.py --out $W/wquant.json > $W/wquant.log 2>&1; echo "wquant rc=$?"
tail -8 $W/wquant.log
timeout 330 python3 -m jaxmoe bench layer --preset mixtral,dsv3 \
  --impls torch,jaxmoe,jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-cached \
  --out $W/layer-fp8.json > $W/layer-fp8.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer-fp8.log | grep -a -E " ms |ERROR|error" | grep -v "bench layer" | tail -20
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 110 python3 benchmarks/layer_profile.py \
  --presets mixtral --fp8-recipe rowwise --out-dir $W > $W/fp8-profile.log 2>&1; echo "profile rc=$?"
grep -a -E "^###|^\| (mpmd|loop|input|fusion|wrapped|triton)" $W/fp8-profile.log | head -40
tar czf "$OUT/call.tgz" -C $W .
