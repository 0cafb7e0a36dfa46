#!/usr/bin/env bash
# Session 33, H200 run 33 call 7 (<= 280 s), on call 5's lease: the layer table's DeepSeek and Qwen3 rows
# with today's default (the combine's backward spread on the row gather kernel since call 1),
# torch and jaxmoe (no torchtitan: its wheels were not carried), settled and interleaved.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call7/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 260 python3 -m jaxmoe bench layer --preset dsv3,qwen3 \
  --impls torch,jaxmoe --out $W/layer-dsv3-qwen3.json > $W/layer-dsv3-qwen3.log 2>&1; echo "layer rc=$?"
kill $SMI
awk -F, 'NR>1 && $4+0>300 {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -E "^\| (mixtral|dsv3|qwen3)" $W/layer-dsv3-qwen3.md | cut -c1-200
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
