#!/usr/bin/env bash
# Session 24, call 8 (<= 260 s, one H100: kind nvidia-h100-x1). Which of the layer's Mosaic
# kernels lags: layer_profile now lists one call's launches in order with their time (the
# Mosaic kernels share one name and carry no HLO op, so the per-op table lumps them), and the
# optimized HLO (--dump-hlo) gives the custom calls' order and operands to name them.
# Mixtral and Qwen3, fwd and fwd+bwd, settled 1.5 s before the profiled calls.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call8/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c8; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 230 python3 benchmarks/layer_profile.py --presets mixtral,qwen3 --passes fwd,fwd+bwd \
  --settle-s 1.5 --top 12 --dump-hlo --out-dir $W/profile > $W/profile.log 2>&1
echo "profile rc=$?"
grep -a -E "^###|^\| [0-9]+ \|" $W/profile.log | head -80
for f in $W/profile/hlo-*.txt; do echo "== $f"; grep -o 'custom_call_target="[a-z_]*"' $f | sort | uniq -c; done
grep -a -i -B2 "error" $W/profile.log | tail -8
tar czf "$OUT/call.tgz" -C $W .
