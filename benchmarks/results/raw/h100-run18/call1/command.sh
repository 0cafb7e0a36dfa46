#!/usr/bin/env bash
# Prepared in session 17 (no device time then), for the first call of the next session
# (<= 590 s): tiles from each group's first row (MosaicTileConfig.group_start_tiles, built in
# session 16) on the GPU for the first time.
#  1. Exactness of the group-start gmm on the six shapes, balanced and skewed (fwd and dgrad,
#     NaN-poisoned outputs, empty groups, tail rows), then skewed timing against the default
#     (split4swz) and torch. Predicted: DeepSeek up fwd 18 -> 17 waves (0.94x -> ~1.0x torch),
#     Mixtral down 17 -> 16 waves.
#  2. Balanced control on Mixtral down (the same tiles there: ~1.00x expected), with the tile
#     order variants (4 or 16 work items along N instead of 8).
#  3. The layer, fwd and fwd+bwd, three presets, every Mosaic kernel's default tiles switched:
#     outputs compared, timed settled. Predicted 1.01-1.03x.
# Run from the repository root: bash benchmarks/results/raw/h100-run18/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 150 python3 benchmarks/mosaic_probe.py --out-dir $W/exact --phases smoke,exact \
  --variants split4swz,split4swzgs --exact-variants split4swzgs --time-budget-s 140 \
  > $W/exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-probe.json | grep -v "'ok': True" | tail -12
grep -c "'ok': True" <(show $W/exact/mosaic-probe.json)
timeout 190 python3 benchmarks/mosaic_probe.py --out-dir $W/skewed --phases time \
  --shapes dsv3-up,mixtral-down,mixtral-up,qwen3-up --variants split4swz,split4swzgs \
  --time-routing skewed --rounds 8 --time-budget-s 175 > $W/skewed.log 2>&1; echo "skewed rc=$?"
show $W/skewed/mosaic-probe.json | tail -28
timeout 90 python3 benchmarks/mosaic_probe.py --out-dir $W/balanced --phases time \
  --shapes mixtral-down --variants split4swz,split4swzgs,split4swzg4,split4swzg16 \
  --time-routing balanced --rounds 8 --time-budget-s 80 > $W/balanced.log 2>&1; echo "balanced rc=$?"
show $W/balanced/mosaic-probe.json | tail -20
timeout 150 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 \
  --time-budget-s 135 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/group-start-probe.json | tail -20
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
