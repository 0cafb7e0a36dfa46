#!/usr/bin/env bash
# Session 19, call 5: confirm call 4's one gain, the fused forward writing the residuals under
# differentiation (residuals_from_kernel=True: 1.018x the default on Mixtral's fwd+bwd, 1.002x
# on Qwen3), in two separate processes of 16 settled rounds each, Mixtral then Qwen3.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call5/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k.endswith(('_ms', 'speedup', 'preset', 'error'))})" "$1"; }
for i in 1 2; do
  timeout 200 python3 benchmarks/glu_dgrad_probe.py --out-dir $W/glu$i --phases layer \
    --presets mixtral,qwen3 --layer-variants unfused,unfused_residuals \
    --rounds 16 --time-budget-s 190 > $W/glu$i.log 2>&1; echo "glu$i rc=$?"
  show $W/glu$i/glu-dgrad-probe.json | tail -2
done
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
