#!/usr/bin/env bash
# Session 18, H100 run 18 call 6 (<= 300 s): is a 2-CTA cluster (TMA multicast of one operand)
# worth building into the gmm at the power limit? jax's dense Hopper kernel with the gmm's CTA
# tile (128 x 256, 4 stages) with and without a cluster, settled (500 ms per peer before each
# sample; run 12's -3% to +4% was unsettled), next to jaxmoe's gmm and torch._grouped_mm, on the
# three shapes whose balanced forwards tie torch (Mixtral up and down, DeepSeek up).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c6; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 280 python3 benchmarks/dense_mosaic_probe.py --out-dir $W --time-budget-s 200 \
  > $W/dense.log 2>&1; echo "dense rc=$?"
python3 -c "
import json
for r in json.load(open('$W/dense-mosaic-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})"
tar czf "$OUT/call.tgz" -C $W .
