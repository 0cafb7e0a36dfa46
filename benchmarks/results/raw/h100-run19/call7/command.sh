#!/usr/bin/env bash
# Session 19, call 7: the work list from one Pallas Triton kernel (work_list_pallas) on the GPU.
#  1. Exactness of the default gmm with it (six shapes, balanced and skewed, fwd and dgrad,
#     NaN-poisoned outputs, empty groups, tail rows).
#  2. Against the XLA work list (5-9 launches, call 6), public grouped_matmul, results compared,
#     settled rounds with torch: fwd and fwd+bwd on Qwen3 up/down, Mixtral down/up, DeepSeek up.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call7/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 150 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases smoke,exact \
  --variants default --time-budget-s 140 > $W/exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-probe.json | grep -v "'ok': True" | tail -12
grep -c "'ok': True" <(show $W/exact/mosaic-probe.json)
timeout 400 python3 benchmarks/work_list_probe.py --out-dir $W/probe --rounds 8 \
  --shapes qwen3-up,qwen3-down,mixtral-down,dsv3-up,mixtral-up --time-budget-s 370 \
  > $W/probe.log 2>&1; echo "probe rc=$?"
show $W/probe/work-list-probe.json | cut -c1-330
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
