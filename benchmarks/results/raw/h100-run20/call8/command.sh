#!/usr/bin/env bash
# Session 20, call 8: call 7 had a lone warpgroup at ~1.5x its shared rate (the second idle on
# every tile: 0.64-0.69x the default's time), so skip should gain; it lost on mixed tiles (call
# 3). Suspect: after a skipped tile the idle warpgroup runs ahead into the next tile and sits at
# the ring's frontier while the other holds each slot ~3 steps longer, so the 4-slot ring
# starves. sync_warpgroups: both compute warpgroups meet at each tile's start. Layer-like groups
# (Mixtral down and up, fwd and dgrad): default / sync / skip+sync; then the Mixtral layer,
# default against skip+sync, settled.
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call8/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c8; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 130 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases smoke,time \
  --shapes mixtral-down,mixtral-up --variants default,sync,skipsync \
  --time-routing layer --rounds 4 --time-budget-s 120 > $W/gemm.log 2>&1; echo "gemm rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gemm/mosaic-probe.json'))['rows']:
    if r.get('phase') == 'time': print(r['shape'], r['op'], r['impl'], round(r['ms'], 4), round(r['tflops'], 1))
    elif r.get('phase') == 'smoke': print('smoke', r.get('impl'), r.get('op'), r.get('ok'), r.get('rel_err'))"
timeout 150 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 6 --presets mixtral \
  --stem skip-sync --variants '{"default": {}, "skipsync": {"skip_empty_warpgroups": true, "sync_warpgroups": true}}' \
  --time-budget-s 140 > $W/layer.log 2>&1; echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/layer/skip-sync.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})"
tar czf "$OUT/call.tgz" -C $W .
