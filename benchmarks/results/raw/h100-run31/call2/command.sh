#!/usr/bin/env bash
# Session 31, H100 run 31 call 2 (<= 400 s), at 1d0bbbb plus the new zero_rows_probe.py: what
# zero rows cost at the power limit.
# 1. zero_rows_probe: the Mosaic gmm on Mixtral down and up, balanced, lhs as the bench's
#    against half its rows zero (the last 64 of every 128-row tile) and all zero, settled
#    interleaved rounds.
# 2. alignment_probe: the layer with groups padded to 64 rows (the default) against 128 (zeros
#    in a group's last tile instead of the next group's rows; more zero rows in the wgrad),
#    Mixtral and Qwen3, fwd+bwd and fwd.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s31c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 2 > $W/smi-trace.csv &
SMI=$!
timeout 120 python3 benchmarks/zero_rows_probe.py --out-dir $W --rounds 12 > $W/zero.log 2>&1
echo "zero rc=$?"; grep '^{' $W/zero.log
timeout 250 python3 benchmarks/alignment_probe.py --out-dir $W --presets mixtral,qwen3 \
  --passes fwd+bwd,fwd --rounds 10 --time-budget-s 230 > $W/align.log 2>&1; echo "align rc=$?"
python3 -c "
import json
for r in json.load(open('$W/alignment-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})"
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
