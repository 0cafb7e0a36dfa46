#!/usr/bin/env bash
# Run 21 call 10: run 19 call 2 again on today's machine: the Mixtral layer (fwd, fwd+bwd) with
# the weight multicast on the plain gmm only (the down projection), settled, 10 interleaved
# rounds, outputs and gradients compared first (group_start_probe.py --sites gmm). Call 9 found
# the down projection's trace the same with and without; is the settled loss still there?
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call10/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c10; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 200 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 --presets mixtral \
  --stem multicast-gmm --sites gmm --variants '{"default": {}, "multicast": {"multicast_weights": true}}' \
  --time-budget-s 190 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/multicast-gmm.json | tail -4 | cut -c1-600
tar czf "$OUT/call.tgz" -C $W .
