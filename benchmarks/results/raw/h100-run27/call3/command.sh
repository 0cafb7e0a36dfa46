#!/usr/bin/env bash
# Session 27, H100 run 27 call 3 (<= 560 s): the last round cut into up to four pieces of the K
# loop (split_last_round, pieces chosen per round: MAX_PIECES = 4) against session 26's halves
# (MAX_PIECES = 2), its kernel alone, and the default without the cut twice
# (split_last_round_probe.py; settled, interleaved; poisoned first calls):
#   1. Mixtral down fwd and Mixtral up dgrad on balanced groups (the gemm bench: 1024 units on
#      66 clusters, 34 left: thirds; halves cannot cut them);
#   2. Mixtral down fwd on the gemm shape's layer-kind groups (928 units, 4 left: quarters);
#   3. the Mixtral layer's own groups (560 units, 32 left: halves either way: a control);
#   4. DeepSeek up fwd and down dgrad on balanced groups (K = 7168, under the default's 8192:
#      2048 units on 132 CTAs, 68 left: thirds), to see whether the threshold should move.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s27c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
P="python3 benchmarks/split_last_round_probe.py --rounds 8"
timeout 150 $P --out-dir $W/balanced --shapes mixtral-down --ops fwd \
  --sizes 2048,2048,2048,2048,2048,2048,2048,2048 --time-budget-s 130 > $W/balanced.log 2>&1; echo "balanced down rc=$?"
timeout 120 $P --out-dir $W/balanced-up --shapes mixtral-up --ops dgrad \
  --sizes 2048,2048,2048,2048,2048,2048,2048,2048 --time-budget-s 100 > $W/balanced-up.log 2>&1; echo "balanced up rc=$?"
timeout 90 $P --out-dir $W/layer-kind --shapes mixtral-down --ops fwd --time-budget-s 70 \
  > $W/layer-kind.log 2>&1; echo "layer-kind rc=$?"
timeout 120 $P --out-dir $W/layer-groups --shapes mixtral-down --ops fwd,pair --rows 8704 \
  --sizes 1088,960,1088,1088,1024,1024,1088,1088 --time-budget-s 100 > $W/layer-groups.log 2>&1; echo "layer groups rc=$?"
S32=$(python3 -c "print(','.join(['1024'] * 32))")
timeout 110 $P --out-dir $W/dsv3 --shapes dsv3-up --ops fwd --sizes $S32 --time-budget-s 90 \
  > $W/dsv3.log 2>&1; echo "dsv3 up rc=$?"
timeout 100 $P --out-dir $W/dsv3-down --shapes dsv3-down --ops dgrad --sizes $S32 --time-budget-s 80 \
  > $W/dsv3-down.log 2>&1; echo "dsv3 down rc=$?"
for f in $W/*/split-last-round-probe.json; do
  python3 - "$f" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if "shape" not in row:
        continue
    keys = ("shape", "m", "op", "units", "workers", "cut_units", "pieces", "halves_cut_units",
            "default_ms", "default_again_ms", "split_ms", "halves_ms", "kernel_only_ms",
            "split_speedup", "halves_speedup", "kernel_only_speedup", "split_rel_diff",
            "halves_rel_diff", "kernel_only_rel_diff", "error")
    print({k: (round(row[k], 4) if isinstance(row[k], float) else row[k]) for k in keys if k in row})
PY
done
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
