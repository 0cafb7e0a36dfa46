#!/usr/bin/env bash
# Session 22, H100 run 22 call 1 (<= 560 s): the weight multicast as the plain gmm's default
# (default_mosaic_gmm_tiles: multicast_weights=True). Smoke check of the new default, then the
# balanced six shapes, fwd and dgrad, settled, interleaved: torch, the tiles before this session
# (split4swzgs) and the new default. Run 19 measured the multicast on the Mixtral products only;
# this decides whether it is the default on every shape.
# Run from the repository root: bash benchmarks/results/raw/h100-run22/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s22c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('shape', 'op', 'impl', 'variant', 'ms', 'tflops', 'ok', 'error', 'budget', 'max_err')})" "$1"; }
timeout 60 python3 benchmarks/mosaic_probe.py --out-dir $W/smoke --phases smoke \
  --variants default --time-budget-s 50 > $W/smoke.log 2>&1; echo "smoke rc=$?"
show $W/smoke/mosaic-probe.json | tail -4
timeout 480 python3 benchmarks/mosaic_probe.py --out-dir $W/balanced --phases time \
  --variants split4swzgs,default --time-routing balanced --rounds 8 --time-budget-s 460 \
  > $W/balanced.log 2>&1; echo "balanced rc=$?"
show $W/balanced/mosaic-probe.json | tail -40
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
