#!/usr/bin/env bash
# Session 33, H200 run 33 call 6 (<= 330 s), on call 5's lease: the layer table's Mixtral row
# with today's default (the combine's backward spread on the row gather kernel since call 1),
# torch and jaxmoe (no torchtitan: its wheels were not carried), settled and interleaved; then
# the public API's Mixtral timing (layer_timing_probe: jit(moe) and jit(grad)).
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call6/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c6; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 200 python3 -m jaxmoe bench layer --preset mixtral \
  --impls torch,jaxmoe --out $W/layer-mixtral.json > $W/layer-mixtral.log 2>&1; echo "layer rc=$?"
timeout 100 python3 benchmarks/layer_timing_probe.py --out-dir $W/timing \
  --presets mixtral --cases fwd,grad > $W/timing.log 2>&1; echo "timing rc=$?"
kill $SMI
awk -F, 'NR>1 && $4+0>300 {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -E "^\| (mixtral|dsv3|qwen3)" $W/layer-mixtral.md | cut -c1-200
grep '^{' $W/timing.log | cut -c1-330
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
