#!/usr/bin/env bash
# Session 25, call 6 (<= 450 s, one H100): the gated FFN's residuals gate and up from one kernel
# (PallasMosaicGatedGroupedMatmul(fused_projections=True): the fused gated kernel's two
# accumulators stored, lhs read once) instead of two plain gmm calls, h from XLA as now. In run
# 24 call 8 the fwd+bwd's up and gate projections took 1500 + 1502 us (641 TFLOP/s each) where
# the forward's fused kernel took 2716 us for both (708). glu_dgrad_probe's layer phase:
# jaxmoe.moe fwd+bwd, the default (unfused), the projections kernel, and the kernel writing h,
# gate and up (unfused_residuals, measured neutral before), gradients against the default's,
# 10 settled interleaved rounds; Mixtral and Qwen3 (where auto takes the gated op), with the
# bench's cotangent and with dy + y.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call6/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c6; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 420 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused,projections,unfused_residuals \
  --cotangents given,from_output --rounds 10 --time-budget-s 330 > $W/layer.log 2>&1
echo "layer rc=$?"
grep '^{' $W/layer.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('preset','cotangent','error') or k.endswith(('_ms','_speedup','dx_rel_diff','w_gate_rel_diff'))})
"
grep -a -B2 -A6 Traceback $W/layer.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
