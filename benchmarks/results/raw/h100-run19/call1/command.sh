#!/usr/bin/env bash
# Session 19, call 1: the weight block multicast in clusters of two CTAs
# (MosaicTileConfig.multicast_weights) on the GPU for the first time.
#  1. Exactness of `mc` (the default tiles + multicast) on the six shapes, balanced and skewed,
#     fwd and dgrad (NaN-poisoned outputs, empty groups, tail rows). A barrier bug would hang:
#     each step has its own timeout.
#  2. Balanced Mixtral down and up, settled: torch, the default, mc, mcg4, mcg16.
#  3. The layer (three presets, fwd and fwd+bwd): every Mosaic gmm default (the plain one, the
#     fused gated one, the input-gradient pair) with multicast_weights, bitwise compared, settled.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 170 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases smoke,exact \
  --variants default,mc --exact-variants mc --time-budget-s 160 \
  > $W/exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-probe.json | grep -v "'ok': True" | tail -12
grep -c "'ok': True" <(show $W/exact/mosaic-probe.json)
timeout 150 python3 benchmarks/mosaic_probe.py --out-dir $W/balanced --phases time \
  --shapes mixtral-down,mixtral-up --variants default,mc,mcg4,mcg16 \
  --time-routing balanced --rounds 8 --time-budget-s 140 > $W/balanced.log 2>&1; echo "balanced rc=$?"
show $W/balanced/mosaic-probe.json | tail -14
timeout 230 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 \
  --stem multicast --variants '{"default": {}, "multicast": {"multicast_weights": true}}' \
  --time-budget-s 210 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/multicast.json | tail -8
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
