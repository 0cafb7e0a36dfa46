#!/usr/bin/env bash
# Session 22, H100 run 22 call 4 (<= 560 s): the layer table with the new default (the weight
# multicast on the plain gmm where K * N >= 32 Mi elements: the Mixtral preset's down
# projection and input gradients; DeepSeek's and Qwen3's kernels are run 18's), settled:
# torch / torchtitan / jaxmoe, three presets, as run 18 call 4.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s22c4; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
# SM clock, power and throttle reasons every 5 s while the benches run.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 520 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
kill $SMI; awk -F, 'NR>1 {c+=$2; p+=$3; n++} END {printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
