#!/usr/bin/env bash
# Session 29, H100 run 29 call 1 (<= 300 s): where the Mixtral layer's time goes today, outside
# the Mosaic kernels (run 24 call 8 found 0.79 ms of 14.52 outside them, before sessions 25-27's
# residuals from the kernel and the cut last round). layer_profile lists one call's launches in
# order, settled 1.5 s first; command buffers off so each launch names its XLA op.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s29c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 250 python3 benchmarks/layer_profile.py \
  --presets mixtral --passes fwd,fwd+bwd --settle-s 1.5 --top 20 --dump-hlo --out-dir $W/profile \
  > $W/profile.log 2>&1
echo "profile rc=$?"
grep -a -E "^###|^\| [0-9]+ \|" $W/profile.log | head -80
grep -a -i -B2 "error" $W/profile.log | tail -8
tar czf "$OUT/call.tgz" -C $W .
