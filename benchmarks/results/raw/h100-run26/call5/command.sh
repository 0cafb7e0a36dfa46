#!/usr/bin/env bash
# Session 26, call 5 (<= 420 s, one H100). Call 4: split_last_round 1.026x on Mixtral down
# fwd (4 of 928 units cut), level elsewhere, the Mixtral layer 0.975x fwd / 1.00x fwd+bwd
# against controls 0.65% and 1.7% apart. The layer's own groups (computed on a CPU from the
# bench's routing, 64-row padding: 1088, 960, 1088, 1088, 1024, 1024, 1088, 1088 in 8704 rows)
# give its down projection and input-gradient pair 560 units on 66 clusters, 32 in the last
# round: both cut. (1) those two products on exactly those groups, poisoned first calls;
# (2) the Mixtral layer again, each program twice (default, split, default, split).
# Run from the repository root: bash benchmarks/results/raw/h100-run26/call5/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s26c5; rm -rf $W; mkdir -p $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 150 python3 benchmarks/split_last_round_probe.py --out-dir $W --shapes mixtral-down \
  --rows 8704 --sizes 1088,960,1088,1088,1024,1024,1088,1088 \
  --ops fwd,pair --rounds 10 --time-budget-s 130 > $W/probe.log 2>&1; echo "probe rc=$?"
grep '^{' $W/probe.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: v for k, v in r.items() if k.endswith(('ms', 'speedup', 'diff', 'units', 'ops')) or k in ('shape', 'op', 'error', 'budget')})
"
timeout 230 python3 benchmarks/group_start_probe.py --out-dir $W/layer --stem split-last-round \
  --sites gmm --presets mixtral --rounds 10 --time-budget-s 210 \
  --variants '{"default": {}, "split": {"split_last_round": true}, "default_again": {}, "split_again": {"split_last_round": true}}' \
  > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-600
grep -a -i -B2 -A12 "Traceback" $W/*.log | tail -30
rm -f $W/hlo-*.txt
tar czf "$OUT/call.tgz" -C $W .
