#!/usr/bin/env bash
# Session 19, call 8: clusters along N (MosaicTileConfig.multicast_rows: one work item at two
# neighbouring column tiles, the lhs block multicast; no group condition, both CTAs' tiles
# alike) for the first time: exactness (six shapes, balanced and skewed, fwd and dgrad), the
# balanced Mixtral products settled (torch, default, mc, mr), the Mixtral layer.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call8/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c8; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 120 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases smoke,exact \
  --variants default,mr --exact-variants mr --time-budget-s 110 > $W/exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-probe.json | grep -v "'ok': True" | tail -8
grep -c "'ok': True" <(show $W/exact/mosaic-probe.json)
timeout 130 python3 benchmarks/mosaic_probe.py --out-dir $W/balanced --phases time \
  --shapes mixtral-down,mixtral-up --variants default,mc,mr \
  --time-routing balanced --rounds 8 --time-budget-s 120 > $W/balanced.log 2>&1; echo "balanced rc=$?"
show $W/balanced/mosaic-probe.json | cut -c1-200 | tail -14
timeout 120 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 --presets mixtral \
  --stem multicast-rows --variants '{"default": {}, "rows": {"multicast_rows": true}}' \
  --time-budget-s 110 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/multicast-rows.json | tail -2
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
