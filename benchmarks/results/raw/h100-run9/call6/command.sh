#!/usr/bin/env bash
# Session 8, H100 call 6 (<= 595 s): the layer table (peers interleaved, ~100 ms samples): torch,
# torchtitan (carried wheels, .whl/) and jaxmoe on the three presets; FP8 rowwise on mixtral and
# dsv3; then the kernel profile of the jaxmoe layer (command buffers off) with the new wgrad.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 330 python3 -W ignore::DeprecationWarning -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
timeout 150 python3 -m jaxmoe bench layer --preset mixtral,dsv3 --impls torch,jaxmoe,jaxmoe-fp8-rowwise \
  --out $W/layer-fp8.json > $W/layer-fp8.log 2>&1; echo "fp8 rc=$?"
tr '\r' '\n' < $W/layer-fp8.log | grep -a -E " ms |ERROR" | grep -v "bench layer" | tail -10
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 80 python3 benchmarks/layer_profile.py \
  --presets mixtral,qwen3 --out-dir $W > $W/profile.log 2>&1; echo "profile rc=$?"; grep "###" $W/layer-profile-jaxmoe.md
tar czf "$OUT/call.tgz" -C $W .
