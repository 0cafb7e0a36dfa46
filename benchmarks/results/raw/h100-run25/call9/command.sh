#!/usr/bin/env bash
# Session 25, call 9 (<= 330 s, one H100): the fused gated kernel now writes h, gate and up under
# differentiation (call 7), three stores per warpgroup tile through one unswizzled 64-row slab,
# each waiting for the previous one to be read. The same with the swizzled epilogue (two slots
# per warpgroup, one store in flight), against the default, Mixtral and Qwen3 fwd+bwd, the
# bench's cotangent and dy + y, 10 settled interleaved rounds.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call9/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c9; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 320 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused_residuals,residuals_swizzled,unfused \
  --cotangents given,from_output --rounds 10 --time-budget-s 250 > $W/layer.log 2>&1
echo "layer rc=$?"
grep '^{' $W/layer.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('preset','cotangent','error') or k.endswith(('_ms','_speedup','dx_rel_diff'))})
"
grep -a -B2 -A8 Traceback $W/layer.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
