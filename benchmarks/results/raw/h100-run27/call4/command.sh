#!/usr/bin/env bash
# Session 27, H100 run 27 call 4 (<= 560 s): call 3 again with the right baseline. Call 3's
# "default" was today's default tiles, which already cut the last round from K = 8192 (so on
# Mixtral it compared the pieces with themselves: 0.98-1.007x, the probe's noise). Here the
# baseline is the same tiles without the cut (uncut, twice), against the cut in up to four
# pieces (split) and in halves only (halves: session 26's rule), 16 settled interleaved rounds:
#   1. Mixtral down fwd and Mixtral up dgrad on balanced groups (1024 units on 66 clusters,
#      34 left: thirds; halves cannot cut them, so "halves" is the fix-up's cost alone);
#   2. the Mixtral layer's own groups, down fwd and the input-gradient pair (560 units, 32
#      left: halves either way; session 26 call 5 measured 1.041x and 1.031x);
#   3. Mixtral down fwd on the gemm shape's layer-kind groups (928 units, 4 left: quarters).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s27c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
P="python3 benchmarks/split_last_round_probe.py --rounds 16"
B8=2048,2048,2048,2048,2048,2048,2048,2048
timeout 150 $P --out-dir $W/balanced --shapes mixtral-down --ops fwd --sizes $B8 \
  --time-budget-s 10 > $W/balanced.log 2>&1; echo "balanced down rc=$?"
timeout 120 $P --out-dir $W/balanced-up --shapes mixtral-up --ops dgrad --sizes $B8 \
  --time-budget-s 10 > $W/balanced-up.log 2>&1; echo "balanced up rc=$?"
timeout 200 $P --out-dir $W/layer-groups --shapes mixtral-down --ops fwd,pair --rows 8704 \
  --sizes 1088,960,1088,1088,1024,1024,1088,1088 --time-budget-s 100 > $W/layer-groups.log 2>&1; echo "layer groups rc=$?"
timeout 100 $P --out-dir $W/layer-kind --shapes mixtral-down --ops fwd --time-budget-s 10 \
  > $W/layer-kind.log 2>&1; echo "layer-kind rc=$?"
python3 - $W/*/split-last-round-probe.json <<'PY'
import json, sys
keys = ("shape", "m", "op", "units", "workers", "cut_units", "pieces", "halves_cut_units",
        "uncut_ms", "uncut_again_ms", "split_ms", "halves_ms", "split_speedup",
        "halves_speedup", "split_rel_diff", "halves_rel_diff", "error")
for path in sys.argv[1:]:
    for row in json.load(open(path))["rows"]:
        if "shape" in row:
            print({k: (round(row[k], 4) if isinstance(row[k], float) else row[k]) for k in keys if k in row})
PY
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
