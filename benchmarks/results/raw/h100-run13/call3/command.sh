#!/usr/bin/env bash
# Session 12, H100 call 3 (<= 590 s): the layer table with the gated FFN op (fused backward off):
# torch, torchtitan and jaxmoe interleaved, three presets, fwd and fwd+bwd; then the forward
# kernel writing the residuals (residuals_from_kernel) against the default, 20 interleaved
# rounds on Mixtral and Qwen3; then where Mixtral's fwd+bwd time goes (kernel profile).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c3; rm -rf $W /tmp/site; mkdir -p $W
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 300 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
export PYTHONPATH=src
timeout 170 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer --presets mixtral,qwen3 \
  --layer-variants unfused,unfused_residuals --rounds 20 --time-budget-s 150 > $W/residuals.log 2>&1; echo "residuals rc=$?"
grep -a '^{' $W/residuals.log | cut -c1-1200
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 90 python3 benchmarks/layer_profile.py --presets mixtral \
  --passes fwd+bwd --out-dir $W > $W/profile.log 2>&1; echo "profile rc=$?"
tail -40 $W/profile.log
tar czf "$OUT/call.tgz" -C $W .
