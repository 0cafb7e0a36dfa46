#!/usr/bin/env bash
# Run 21 call 8: prefetch_tile_info (the compute warpgroups read the next tile's work-list
# entries under this tile's main loop instead of between tiles): exactness on three shapes
# (balanced and skewed with empty groups, fwd and dgrad, NaN-poisoned outputs), then timed against
# the default and torch on the six shapes, balanced, fwd and dgrad, settled, 6 interleaved rounds;
# then its trace on Qwen3 up (the time between tiles).
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call8/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c8; rm -rf $W; mkdir -p $W/exact $W/gemm $W/trace
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
timeout 150 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases exact \
  --shapes qwen3-down,dsv3-up,mixtral-down --exact-variants prefetch > $W/exact.log 2>&1; echo "exact rc=$?"
python3 -c "
import json
rows = json.load(open('$W/exact/mosaic-probe.json'))['rows']
print(sum(r.get('ok') is True for r in rows), 'ok of', len(rows))
for r in rows:
    if r.get('ok') is not True: print(r)"
timeout 400 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes qwen3-down,qwen3-up,dsv3-down,dsv3-up,mixtral-up,mixtral-down --variants default,prefetch \
  --time-routing balanced --rounds 6 --time-budget-s 390 > $W/gemm.log 2>&1; echo "gemm rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gemm/mosaic-probe.json'))['rows']:
    if r.get('phase') == 'time': print(r['shape'], r['op'], r['impl'], round(r['ms'], 4), round(r['tflops'], 1))"
timeout 60 python3 benchmarks/kernel_trace_probe.py --out-dir $W/trace --cases qwen3-up:balanced \
  --changes '{"prefetch_tile_info": true}' > $W/trace/probe.log 2>&1; echo "trace rc=$?"
grep '^{' $W/trace/probe.log | cut -c1-900
tar czf "$OUT/call.tgz" -C $W .
