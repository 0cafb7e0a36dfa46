#!/usr/bin/env bash
# Session 12, H100 call 8 (<= 300 s): where the Qwen3 FP8 layer's time goes with FP8 weight
# gradients against bf16 ones (call 7: 6.86 against 5.69 ms fwd+bwd): kernel time per op.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
W=/tmp/s12c8; rm -rf $W; mkdir -p $W/high $W/fp8
timeout 130 python3 benchmarks/layer_profile.py --presets qwen3 --passes fwd+bwd --fp8-recipe rowwise \
  --fp8-wgrad high --out-dir $W/high > $W/high.log 2>&1; echo "high rc=$?"
head -30 $W/high.log
timeout 130 python3 benchmarks/layer_profile.py --presets qwen3 --passes fwd+bwd --fp8-recipe rowwise \
  --fp8-wgrad fp8 --out-dir $W/fp8 > $W/fp8.log 2>&1; echo "fp8 rc=$?"
head -30 $W/fp8.log
tar czf "$OUT/call.tgz" -C $W .
