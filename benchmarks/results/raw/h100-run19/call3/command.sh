#!/usr/bin/env bash
# Session 19, call 3: why multicast_weights loses in the layer (calls 1-2: the Mixtral layer
# 0.968-0.978x) while it gains on the gemm bench's groups (balanced 0.998-1.031x, skewed
# 1.009-1.035x). The gemm with the layer's kind of groups (multinomial loads on 7/8 of the rows,
# each padded to 64 rows, the rest tail rows), default against mc, with torch, settled.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 200 python3 benchmarks/mosaic_probe.py --out-dir $W/layer-groups --phases time \
  --shapes mixtral-down,mixtral-up,dsv3-up --variants default,mc \
  --time-routing layer --rounds 8 --time-budget-s 190 > $W/layer-groups.log 2>&1; echo "layer-groups rc=$?"
show $W/layer-groups/mosaic-probe.json | tail -20
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
