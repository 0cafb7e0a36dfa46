#!/usr/bin/env bash
# Session 24, call 5 (<= 590 s, kind nvidia-h100-x4; four GPUs of one host, one process each).
# The layer table again with today's default (the dispatch plan counted, not sorted: call 4
# measured 1.01-1.03x on the DeepSeek and Qwen3 layers, Mixtral level), on every GPU at once,
# so that each preset and pass has four figures against torch and torchtitan: the spread the
# layer bars (>= 1.25x torch, >= 600 TFLOP/s Mixtral fwd+bwd) are judged on.
# nvidia-smi samples every GPU every 5 s (smi-trace.csv).
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call5/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c5; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | tr '\n' ' ')
PIDS=""
for g in $GPUS; do
  D=$W/gpu$g; mkdir -p $D
  ( export CUDA_VISIBLE_DEVICES=$g
    timeout 560 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
      --impls torch,torchtitan,jaxmoe --out $D/layer.json > $D/layer.log 2>&1
    echo "gpu$g layer rc=$?" ) &
  PIDS="$PIDS $!"
done
wait $PIDS
kill $SMI
for g in $GPUS; do
  echo "== gpu$g"; awk -F, -v g=$g 'NR>1 && $2+0==g {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
  cat $W/gpu$g/layer.log | tr '\r' '\n' | grep -a -E "(fwd|bwd).* ms |ERROR|Error|skipped" | grep -v "bench " | tail -10
done
tar czf "$OUT/call.tgz" -C $W .
