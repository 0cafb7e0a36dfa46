#!/usr/bin/env bash
# Run 21 call 5: stagger_steps (the second compute warpgroup 1-3 K steps behind the first, so
# their epilogues run under each other's wgmma) against the default and torch, balanced, fwd and
# dgrad, interleaved and settled (mosaic_probe.py); then the trace of stagger2 on Qwen3 up (does
# the lag persist across tiles?).
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call5/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c5; rm -rf $W; mkdir -p $W/gemm $W/trace
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
timeout 330 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes qwen3-down,qwen3-up,dsv3-down,mixtral-down --variants default,stagger1,stagger2,stagger3 \
  --time-routing balanced --rounds 6 --time-budget-s 320 > $W/gemm.log 2>&1; echo "gemm rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gemm/mosaic-probe.json'))['rows']:
    if r.get('phase') == 'time': print(r['shape'], r['op'], r['impl'], round(r['ms'], 4), round(r['tflops'], 1))"
timeout 60 python3 benchmarks/kernel_trace_probe.py --out-dir $W/trace --cases qwen3-up:balanced \
  --changes '{"stagger_steps": 2}' > $W/trace/probe.log 2>&1; echo "trace rc=$?"
grep '^{' $W/trace/probe.log | cut -c1-1200
tar czf "$OUT/call.tgz" -C $W .
