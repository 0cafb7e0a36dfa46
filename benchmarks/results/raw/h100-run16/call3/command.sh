#!/usr/bin/env bash
# Session 15, H100 run 16 call 3 (<= 560 s): the compute warpgroups splitting a tile's rows
# (split_rows): the fused gate/up kernel and the layer's forward against the new default; the
# plain gmm (3-slot ring, m64n256) against its default, smoke-checked, fwd and dgrad.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s15c3; rm -rf $W; mkdir -p $W
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 280 python3 benchmarks/gated_tiles_probe.py --out-dir $W \
  --variants default,split,split_unswizzled --time-budget-s 220 > $W/gated.log 2>&1; echo "gated rc=$?"
show $W/gated-tiles-probe.json
timeout 230 python3 benchmarks/mosaic_probe.py --out-dir $W --phases smoke,time --rounds 10 \
  --variants s4e64ringswz,split3swz --shapes mixtral-up,mixtral-down,qwen3-up \
  --time-budget-s 200 > $W/mosaic.log 2>&1; echo "mosaic rc=$?"
show $W/mosaic-probe.json | grep -v "'phase': 'smoke'.*'ok': True" | tail -30
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
