#!/usr/bin/env bash
# Session 15, H100 run 16 call 1 (<= 560 s): the opt-in fused input gradient (exactness and time
# against the two dgrads, then the layer with it), the last wave of the Mixtral down projection
# (wave_probe), and jax's dense Hopper kernel with and without a 2-CTA cluster, settled.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s15c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { grep -a '^{' "$1" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})"; }
timeout 130 python3 benchmarks/input_dgrad_probe.py --out-dir $W --time-budget-s 100 > $W/input-dgrad.log 2>&1; echo "input_dgrad rc=$?"
show $W/input-dgrad-probe.json | tail -7
timeout 80 python3 benchmarks/wave_probe.py --out-dir $W > $W/wave.log 2>&1; echo "wave rc=$?"
show $W/wave-probe.json
timeout 200 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --layer-variants unfused,input_dgrad --time-budget-s 170 > $W/glu-layer.log 2>&1; echo "glu rc=$?"
show $W/glu-dgrad-probe.json | tail -8
timeout 110 python3 benchmarks/dense_mosaic_probe.py --out-dir $W --shapes mixtral-down,mixtral-up \
  --time-budget-s 80 > $W/dense.log 2>&1; echo "dense rc=$?"
show $W/dense-mosaic-probe.json | grep -v check
tail -3 $W/*.log | grep -a -i error | head
tar czf "$OUT/call.tgz" -C $W .
