#!/usr/bin/env bash
# Session 25, call 4 (<= 200 s, one H100): is the half tiles' cost (call 3: qwen3-up 0.81x) in
# the half tiles themselves or in every tile? The Qwen3 products on balanced groups (512 rows
# each: no half tile) and on the layer's kind (about half the groups end in one), default
# against hk, 5 interleaved rounds with torch.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c4; rm -rf $W; mkdir -p $W/balanced $W/layer
for routing in balanced layer; do
  timeout 90 python3 benchmarks/mosaic_probe.py --out-dir $W/$routing --phases time \
    --shapes qwen3-up,qwen3-down --variants default,hk --time-routing $routing \
    --rounds 5 --time-budget-s 80 > $W/$routing.log 2>&1; echo "$routing rc=$?"
  grep '^{' $W/$routing.log | grep '"phase": "time"' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: v for k, v in r.items() if k in ('routing','shape','op','impl','ms','tflops')})
"
done
tar czf "$OUT/call.tgz" -C $W .
