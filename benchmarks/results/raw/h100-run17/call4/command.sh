#!/usr/bin/env bash
# Session 16, H100 run 17 call 4 (<= 170 s): call 3's skewed forwards fell to 0.94-0.98x torch
# (run 14, before split rows: 1.00-1.04x). Is it split rows? The old default (column split,
# s4e64ringswz) against the new (split4swz) and torch, skewed, settled, in the same rounds.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s16c4; rm -rf $W; mkdir -p $W
timeout 160 python3 benchmarks/mosaic_probe.py --out-dir $W --phases time --time-routing skewed \
  --rounds 6 --variants s4e64ringswz,split4swz --shapes dsv3-up,mixtral-down \
  --time-budget-s 140 > $W/mosaic.log 2>&1; echo "mosaic rc=$?"
python3 -c "
import json
for r in json.load(open('$W/mosaic-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('shape', 'op', 'impl', 'ms', 'tflops', 'is_default', 'error', 'budget', 'at')})"
tar czf "$OUT/call.tgz" -C $W .
