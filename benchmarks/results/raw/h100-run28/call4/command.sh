#!/usr/bin/env bash
# Session 28, H100 run 28 call 4 (<= 300 s): the clock and power under torch's kernel and ours
# (gemm_clock_probe.py: each contender alone in alternating 3 s phases, nvidia-smi every 0.2 s;
# ms x MHz = cycles per call). Balanced Mixtral down fwd, where we are 0.98x torch: torch,
# jaxmoe (default: thirds), the same tiles uncut, and the tile order walking 4 or 16 pairs of
# row tiles per band (group_swizzle; the default 8 covers one group's 16 row tiles, which moves
# the fewest HBM bytes: ~1.9 GB a call against ~2.3 GB for 4). Then balanced Mixtral up fwd,
# where we are level (1.008x), as the contrast.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s28c4; rm -rf $W; mkdir -p $W/down $W/up
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 170 python3 benchmarks/gemm_clock_probe.py --out-dir $W/down --shape mixtral-down \
  --phases 15 --variants '{"uncut": {"split_last_round": false}, "swizzle4": {"group_swizzle": 4}, "swizzle16": {"group_swizzle": 16}}' \
  > $W/down.log 2>&1; echo "down rc=$?"
timeout 90 python3 benchmarks/gemm_clock_probe.py --out-dir $W/up --shape mixtral-up --phases 6 \
  > $W/up.log 2>&1; echo "up rc=$?"
for f in $W/down.log $W/up.log; do
  grep '^{' $f | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['phase'], r['variant'], round(r['ms_per_call'], 4), r['sm_mhz'], r['power_w'], round(r.get('mcycles_per_call') or 0, 1))"
done
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
