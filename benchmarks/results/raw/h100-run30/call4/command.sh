#!/usr/bin/env bash
# Session 30, H100 run 30 call 4 (<= 560 s), a fresh lease. The layer table with today's
# default (since run 27's table: approx_math in both fused gated kernels, session 30; only the
# fused gated forward runs in the default layer), as run 27 call 1: three presets; torch,
# torchtitan, jaxmoe; settled, interleaved; then the public API's timing
# (layer_timing_probe: jit(moe) pipelined and synced per call, jit(grad)).
# nvidia-smi samples every 5 s (smi-trace.csv).
# Run from the repository root: bash benchmarks/results/raw/h100-run30/call4/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s30c4; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 400 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
timeout 170 python3 benchmarks/layer_timing_probe.py --out-dir $W/timing \
  --presets mixtral,dsv3,qwen3 --cases fwd,grad > $W/timing.log 2>&1; echo "timing rc=$?"
kill $SMI
awk -F, 'NR>1 && $4+0>300 {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -E "^\| (mixtral|dsv3|qwen3)" $W/layer.md | cut -c1-150
grep '^{' $W/timing.log | cut -c1-330
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
