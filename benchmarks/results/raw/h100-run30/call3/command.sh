#!/usr/bin/env bash
# Session 30, H100 run 30 call 3 (<= 400 s), on call 2's H100, approx_math the default of both
# fused gated kernels.
# 1. Why fused_backward is faster alone (1.07x, call 1) but not in the Mixtral layer (0.985x,
#    0.994x, call 2): per-launch kernel times of the layer's fwd+bwd, default against
#    fused_backward (settled 1.5 s, command buffers off so each kernel names its op).
# 2. The Mixtral layer bench (torch, jaxmoe) and the public API's timing on this chip.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s30c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python3 benchmarks/layer_profile.py \
  --presets mixtral --passes fwd+bwd --settle-s 1.5 --top 16 --out-dir $W/profile \
  --backend-variants '{"fused_backward": {"fused_backward": true}}' > $W/profile.log 2>&1
echo "profile rc=$?"
grep -a -E "^###|^\| [0-9]+ \|" $W/profile.log | cut -c1-160 | head -60
timeout 150 python3 -m jaxmoe bench layer --preset mixtral --impls torch,jaxmoe \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
grep -E "^\| mixtral" $W/layer.md | cut -c1-150
timeout 60 python3 benchmarks/layer_timing_probe.py --out-dir $W/timing \
  --presets mixtral --cases fwd,grad > $W/timing.log 2>&1; echo "timing rc=$?"
grep '^{' $W/timing.log | cut -c1-330
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
