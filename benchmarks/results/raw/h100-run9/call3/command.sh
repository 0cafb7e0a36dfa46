#!/usr/bin/env bash
# Session 8, H100 call 3 (<= 300 s): the layer's launch latency against its steady per-call time
# (n back-to-back calls, n = 1..16), with XLA's command buffers on (default) and off.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 170 python3 benchmarks/launch_latency_probe.py --presets mixtral,dsv3,qwen3 --out-dir $W 2>&1 \
  | grep -v Warn; echo "rc=$?"
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 100 python3 benchmarks/launch_latency_probe.py \
  --presets mixtral --tag=-nocb --out-dir $W 2>&1 | grep -v Warn
tar czf "$OUT/call.tgz" -C $W .
