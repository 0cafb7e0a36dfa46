#!/usr/bin/env bash
# Session 19, call 4: the SwiGLU elementwise pass (0.50 ms of Mixtral's fwd+bwd, run 17) on
# today's kernels. The gated FFN's backend variants, the layer fwd+bwd, settled, gradients
# compared: unfused (the default), the activation's derivative in the down dgrad's epilogue
# (fused: 0.95x on Mixtral in run 13, before the ring, split rows and group start), the forward
# kernel writing the residuals (unfused_residuals: 0.96x Mixtral, fused-glu run 2), and both.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 500 python3 benchmarks/glu_dgrad_probe.py --out-dir $W/glu --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused,fused,unfused_residuals,fused_residuals \
  --rounds 10 --time-budget-s 480 > $W/glu.log 2>&1; echo "glu rc=$?"
show $W/glu/glu-dgrad-probe.json | tail -4
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
