#!/usr/bin/env bash
# Session 13, H100 call 5 (<= 590 s): half tiles in the Mosaic gmm (a tile whose rows lie in one
# 64-row half multiplies only that half): exactness on the six shapes (balanced, skewed with
# empty groups and tail rows; fwd and dgrad) and skewed timing against the default and torch;
# then the layer with groups padded to 64 rows (with and without half tiles) against today's
# 128-row padding, three presets, fwd+bwd and fwd, interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s13c5; rm -rf $W; mkdir -p $W
timeout 240 python3 benchmarks/mosaic_probe.py --out-dir $W --variants s4e64ringswz,s4e64ringswzhalf \
  --exact-variants s4e64ringswzhalf --time-routing skewed --rounds 6 --time-budget-s 200 > $W/probe.log 2>&1; echo "probe rc=$?"
grep -a '"phase": "exact"' $W/probe.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['shape'], r['routing'], r['op'], r['impl'], r.get('ok'), '%.4g' % r.get('rel_err', -1), r.get('error', ''))"
grep -a '"phase": "time"\|budget\|"smoke"' $W/probe.log | cut -c1-260
timeout 330 python3 benchmarks/half_tile_probe.py --out-dir $W --time-budget-s 300 > $W/half.log 2>&1; echo "half rc=$?"
grep -a '^{' $W/half.log | cut -c1-900
tail -3 $W/mosaic-errors.log 2>/dev/null
tar czf "$OUT/call.tgz" -C $W .
