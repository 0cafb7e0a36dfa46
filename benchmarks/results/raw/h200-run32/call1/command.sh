#!/usr/bin/env bash
# Session 32, H200 run 32 call 1 (<= 560 s), a fresh lease (no H100 lent this session).
# 1. Two levers that interleaved rounds judged level, now in alternating settled phases
#    (variant_clock_probe, each variant alone for 3 s at a time, nvidia-smi every 0.2 s):
#    zero_foreign_halves (run 31 call 3's diff, applied to this tree; kept off in the fused down
#    dgrad's tiles, whose ring operands refuse it) and the last round uncut (split_last_round
#    off: what session 26-27's pieces buy the settled layer), on the gmm's and the gated
#    kernel's default tiles; Mixtral fwd+bwd (15 phases), Qwen3 fwd+bwd (zero halves only, 10).
# 2. The layer table's Mixtral row with today's default (fused_backward on since session 31):
#    torch, torchtitan, jaxmoe, settled, interleaved.
# Run from the repository root: bash benchmarks/results/raw/h200-run32/call1/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s32c1; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 190 python3 benchmarks/variant_clock_probe.py --out-dir $W/mixtral --preset mixtral \
  --variants '{"zero_halves": {"zero_foreign_halves": true}, "uncut": {"split_last_round": false}}' \
  --sites gmm,gated --phases 15 > $W/mixtral.log 2>&1; echo "mixtral rc=$?"
timeout 120 python3 benchmarks/variant_clock_probe.py --out-dir $W/qwen3 --preset qwen3 \
  --variants '{"zero_halves": {"zero_foreign_halves": true}}' \
  --sites gmm,gated --phases 10 > $W/qwen3.log 2>&1; echo "qwen3 rc=$?"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 200 python3 -m jaxmoe bench layer --preset mixtral \
  --impls torch,torchtitan,jaxmoe --out $W/layer-mixtral.json > $W/layer-mixtral.log 2>&1; echo "layer rc=$?"
kill $SMI
for p in mixtral qwen3; do python3 -c "
import json
rows = json.load(open('$W/$p/variant-clock-probe.json'))['rows']
for r in rows:
    if 'variant' in r: print('$p', r['phase'], r['variant'], round(r['ms_per_call'], 4), r['sm_mhz'], r['power_w'])
    if 'summary' in r: print('$p', json.dumps(r['summary']))"; done
awk -F, 'NR>1 && $4+0>300 {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -E "^\| (mixtral|dsv3|qwen3)" $W/layer-mixtral.md | cut -c1-160
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
