#!/usr/bin/env bash
# Session 27, call 1 (<= 560 s, one H100). The layer table on an H100 with today's default
# (since session 26 the last round of the down projection and of the input-gradient pair cut into
# K halves, split_last_round, from K = 8192: Mixtral's), as run 25 call 8: three presets; torch,
# torchtitan, jaxmoe; settled, interleaved; then the same presets timed through the public API as
# a user would (layer_timing_probe: jit(moe) pipelined and synced per call, jit(grad)).
# nvidia-smi samples every 5 s (smi-trace.csv).
# Run from the repository root: bash benchmarks/results/raw/h100-run27/call1/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s27c1; rm -rf $W /tmp/site; mkdir -p $W
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
