#!/usr/bin/env bash
# Session 13, H100 call 1 (<= 590 s): ping-pong compute warpgroups in the Mosaic gmm (each
# warpgroup its own 128 x 128 or 64 x 256 tiles, alternating) against the default
# (s4e64ringswz = 128 x 256, cooperative): smoke, exactness on the six shapes (balanced and
# skewed, fwd and dgrad), then fwd and dgrad timed with torch in 8 interleaved rounds, balanced.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s13c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > $W/smi-start.txt 2>&1
timeout 560 python3 benchmarks/mosaic_probe.py --out-dir $W --variants s4e64ringswz,pp128s6,pp128s5,pp64x256s4 \
  --exact-variants pp128s6,pp64x256s4 --rounds 8 --time-budget-s 500 > $W/probe.log 2>&1; echo "probe rc=$?"
grep -a '^{' $W/probe.log | grep -a -v '"phase": "exact"' | cut -c1-400
grep -a '"phase": "exact"' $W/probe.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['shape'], r['routing'], r['op'], r['impl'], r.get('ok'), '%.3g' % r.get('rel_err', -1), r.get('error', ''))"
tail -5 $W/mosaic-errors.log 2>/dev/null
tar czf "$OUT/call.tgz" -C $W .
