#!/usr/bin/env bash
# Session 20, call 5: is skip_empty_warpgroups slower without any half tile? Balanced groups
# (2048 rows each: every tile whole, nothing to skip), Mixtral down and up, fwd and dgrad,
# default / skip / skip per step with torch, settled. The same PTX main loop either way (call
# 4): if skip is slower here too, the branch costs by itself; if not, the half tiles do.
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call5/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 200 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes mixtral-down,mixtral-up --variants default,skip,skipstep \
  --time-routing balanced --rounds 6 --time-budget-s 190 > $W/gemm.log 2>&1; echo "gemm rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gemm/mosaic-probe.json'))['rows']:
    if r.get('phase') == 'time': print(r['shape'], r['op'], r['impl'], round(r['ms'], 4), round(r['tflops'], 1))"
tar czf "$OUT/call.tgz" -C $W .
