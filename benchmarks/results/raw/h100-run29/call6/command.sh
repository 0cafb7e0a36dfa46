#!/usr/bin/env bash
# Session 29, H100 run 29 call 6 (<= 260 s): call 5 again on Mixtral, 16 rounds (call 5, 10
# rounds: fused backward 1.015x with the bench's cotangent, 0.996x with one from the output;
# the probe's noise is ~1.5%, the kernel's gain ~0.7% of the pass).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s29c6; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 240 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral --layer-variants unfused,fused --cotangents given,from_output \
  --rounds 16 --time-budget-s 120 > $W/probe.log 2>&1; echo "probe rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'min' not in k})"
grep -a -i -B2 "error" $W/probe.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
