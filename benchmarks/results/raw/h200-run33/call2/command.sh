#!/usr/bin/env bash
# Session 33, H200 run 33 call 2 (<= 300 s): where the layers' fwd+bwd spends outside the Mosaic
# kernels today (fused down dgrad since session 31, the row gather kernel in the dispatch and,
# since call 1, the combine's backward spread). layer_profile lists one call's launches in
# order, settled 1.5 s first; command buffers off so each launch names its XLA op.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call2/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 270 python3 benchmarks/layer_profile.py \
  --presets mixtral,qwen3 --passes fwd+bwd --settle-s 1.5 --top 24 --dump-hlo --out-dir $W/profile \
  > $W/profile.log 2>&1
echo "profile rc=$?"
grep -a -E "^###|^\| " $W/profile.log | head -120
grep -a -i -B2 "error" $W/profile.log | tail -8
tar czf "$OUT/call.tgz" -C $W .
