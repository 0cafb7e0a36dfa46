#!/usr/bin/env bash
# Session 20, call 3: skip_empty_warpgroups per kernel. ptxas (call 2) shows no serialization,
# no spills and the same 168 registers with or without it, so: the plain gmm alone on the
# layer's kind of groups (multinomial loads on 7/8 of the rows, padded to 64), Mixtral down and
# up, fwd and dgrad, default / skip / skip per step with torch, settled; then the Mixtral layer
# with the three (call 2's probe failed on three variants; fixed).
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 200 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes mixtral-down,mixtral-up --variants default,skip,skipstep \
  --time-routing layer --rounds 6 --time-budget-s 190 > $W/gemm.log 2>&1; echo "gemm rc=$?"
show $W/gemm/mosaic-probe.json | grep "'phase': 'time'" | cut -c1-200
timeout 200 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 8 --presets mixtral \
  --stem skip-modes --variants '{"default": {}, "step": {"skip_empty_warpgroups": true, "skip_per_step": true}, "skip": {"skip_empty_warpgroups": true}}' \
  --time-budget-s 190 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/skip-modes.json
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
