#!/usr/bin/env bash
# Run 21 call 13: call 12 again with the default profiled again last (A, B, A: is call 12's uniform slowdown of every kernel the order, i.e. the clock drifting?) -- which kernels lose when the Mixtral layer's plain gmm multicasts the weights
# (call 10: fwd+bwd 0.985x settled): per-op kernel time of the layer's fwd+bwd, default and
# multicast on the plain gmm, each profiled after 1.5 s of back-to-back calls (the settled clock),
# XLA's command buffers off (layer_profile.py --settle-s --variants).
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call13/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c13; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
timeout 240 env XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 benchmarks/layer_profile.py \
  --presets mixtral --passes fwd+bwd --settle-s 1.5 --sites gmm --top 10 \
  --variants '{"multicast": {"multicast_weights": true}, "default_again": {}}' --out-dir $W/profile > $W/profile.log 2>&1
echo "profile rc=$?"
grep -v "^|---" $W/profile/layer-profile-jaxmoe.md | head -45
tar czf "$OUT/call.tgz" -C $W .
