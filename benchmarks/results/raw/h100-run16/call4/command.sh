#!/usr/bin/env bash
# Session 15, H100 run 16 call 4 (<= 520 s): the plain gmm with the compute warpgroups splitting
# a tile's rows on a 4-slot ring (the unswizzled slab staged 128 columns at a time), swizzled
# epilogue or not, against the default on the six gemm shapes, fwd and dgrad, balanced, settled;
# every variant smoke-checked against a float32 reference first.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s15c4; rm -rf $W; mkdir -p $W
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('phase', 'shape', 'op', 'impl', 'ms', 'tflops', 'ok', 'rel_err', 'error', 'variant', 'done')})" "$1"; }
timeout 500 python3 benchmarks/mosaic_probe.py --out-dir $W --phases smoke,time --rounds 8 \
  --variants s4e64ringswz,split4swz,split4 --time-budget-s 440 > $W/mosaic.log 2>&1; echo "mosaic rc=$?"
show $W/mosaic-probe.json | grep -v "'ok': True" | tail -60
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
