#!/usr/bin/env bash
# Session 20, call 7: does one compute warpgroup alone have the tensor cores' full rate? (call
# 6's 64-row groups were HBM-bound: each group's weights read for one tile, no answer.) Balanced
# Mixtral down and up (compute-bound): the default against the second warpgroup never
# multiplying (results wrong, timing only), as a branch around the tile (idle1) or per step
# (idle1step). About the default's time: a lone warpgroup runs at half the SM's rate (a 64-row
# item needs the two to split its columns); about half: it has the full rate.
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call7/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 150 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes mixtral-down,mixtral-up --variants default,idle1,idle1step \
  --time-routing balanced --rounds 4 --time-budget-s 140 > $W/gemm.log 2>&1; echo "gemm rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gemm/mosaic-probe.json'))['rows']:
    if r.get('phase') == 'time': print(r['shape'], r['op'], r['impl'], round(r['ms'], 4), round(r['tflops'], 1))"
tar czf "$OUT/call.tgz" -C $W .
