#!/usr/bin/env bash
# Session 31, H100 run 31 call 4 (<= 420 s), the working tree of call 3. Call 3's layer rounds
# had zero_foreign_halves at 1.009x (Mixtral) and 1.013x (Qwen3) fwd+bwd but 0.979x / 0.992x
# fwd, inside what the probe resolves. Again with twice the rounds on Mixtral, then the
# default against itself (the probe's noise on this chip).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s31c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 2 > $W/smi-trace.csv &
SMI=$!
timeout 250 python3 benchmarks/group_start_probe.py --out-dir $W --stem zero-halves \
  --variants '{"default": {}, "zero_halves": {"zero_foreign_halves": true}}' --sites gmm,gated \
  --presets mixtral --passes fwd+bwd,fwd --rounds 20 --time-budget-s 230 > $W/layer.log 2>&1
echo "layer rc=$?"
timeout 120 python3 benchmarks/group_start_probe.py --out-dir $W --stem same \
  --variants '{"default": {}, "default_again": {}}' --sites gmm,gated \
  --presets mixtral --passes fwd+bwd --rounds 10 --time-budget-s 100 > $W/same.log 2>&1
echo "same rc=$?"
for f in zero-halves same; do python3 -c "
import json
for r in json.load(open('$W/$f.json'))['rows']:
    print('$f', {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})"; done
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
