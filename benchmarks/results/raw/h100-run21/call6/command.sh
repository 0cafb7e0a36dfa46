#!/usr/bin/env bash
# Run 21 call 6: direct_stores (whole slabs from the registers straight to HBM, no shared memory
# or TMA in the epilogue): exactness on two shapes (balanced and skewed, fwd and dgrad, NaN-poisoned
# outputs), then timed against the default and torch, balanced, interleaved and settled; then
# its trace on Qwen3 up (the epilogue's share).
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call6/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c6; rm -rf $W; mkdir -p $W/exact $W/gemm $W/trace
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
timeout 150 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases exact \
  --shapes qwen3-up,mixtral-up --exact-variants direct > $W/exact.log 2>&1; echo "exact rc=$?"
python3 -c "
import json
for r in json.load(open('$W/exact/mosaic-probe.json'))['rows']:
    print({k: r[k] for k in r if k not in ('tiles',)})" | head -40
timeout 300 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes qwen3-up,qwen3-down,mixtral-up,dsv3-down --variants default,direct \
  --time-routing balanced --rounds 6 --time-budget-s 290 > $W/gemm.log 2>&1; echo "gemm rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gemm/mosaic-probe.json'))['rows']:
    if r.get('phase') == 'time': print(r['shape'], r['op'], r['impl'], round(r['ms'], 4), round(r['tflops'], 1))"
timeout 60 python3 benchmarks/kernel_trace_probe.py --out-dir $W/trace --cases qwen3-up:balanced \
  --changes '{"direct_stores": true}' > $W/trace/probe.log 2>&1; echo "trace rc=$?"
grep '^{' $W/trace/probe.log | cut -c1-1200
tar czf "$OUT/call.tgz" -C $W .
