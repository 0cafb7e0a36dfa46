#!/usr/bin/env bash
# Session 25, call 7 (<= 400 s, one H100): call 6 had the fused gated kernel writing h, gate and
# up under differentiation (residuals_from_kernel=True) at 0.998x / 1.025x (Mixtral, the bench's
# cotangent / dy + y) and 1.010x / 1.011x (Qwen3) the default. Again, alone with the default,
# 12 settled interleaved rounds.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call7/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 380 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused,unfused_residuals \
  --cotangents given,from_output --rounds 12 --time-budget-s 300 > $W/layer.log 2>&1
echo "layer rc=$?"
grep '^{' $W/layer.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('preset','cotangent','error') or k.endswith(('_ms','_speedup','dx_rel_diff'))})
"
tar czf "$OUT/call.tgz" -C $W .
