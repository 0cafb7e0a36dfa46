#!/usr/bin/env bash
# Session 20, call 1: MosaicTileConfig.skip_empty_warpgroups (a compute warpgroup owning no rows
# of a work item passes its ring steps without a wgmma; with split rows a group's last tile of
# <= 64 rows runs one warpgroup).
#  1. smoke (default, skip) on a small skewed problem against float32;
#  2. the MoE layer, three presets, fwd and fwd+bwd, default against skip on both kernels'
#     default tiles (gmm and the fused gated kernel), settled, interleaved, outputs compared;
#  3. exactness of skip on the six shapes, balanced and skewed (NaN-poisoned outputs, empty
#     groups, tail rows zero).
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 90 python3 benchmarks/mosaic_probe.py --out-dir $W/smoke --phases smoke \
  --variants default,skip > $W/smoke.log 2>&1; echo "smoke rc=$?"
show $W/smoke/mosaic-probe.json | cut -c1-300
timeout 300 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 \
  --stem skip-empty --variants '{"default": {}, "skip": {"skip_empty_warpgroups": true}}' \
  --time-budget-s 270 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/skip-empty.json
timeout 170 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases exact \
  --variants default,skip --exact-variants skip > $W/exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-probe.json | grep -v "'impl': 'triton'" | cut -c1-260
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
