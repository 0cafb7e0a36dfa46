#!/usr/bin/env bash
# Session 24, call 7 (<= 520 s, one H100: kind nvidia-h100-x1). The fused down dgrad
# (fused_backward: the activation's derivative in the down projection's dgrad epilogue) lost
# 0.95-0.98x in the layer's fwd+bwd (runs 13, 19). Call 2's profile shows why on the bench: its
# cotangent dy does not depend on the output, so XLA runs the down dgrad before the forward's
# h = act(gate) * up and fuses h's pass into the activation's backward (one pass reads gate and
# up for both). In a model the cotangent comes from later layers, which read y; then the
# unfused path pays h's pass, h_bar's store and a separate backward pass (2.1 GB on Mixtral)
# where the fused kernel moves 1.6 GB. Here both, unfused and fused, with the bench's
# cotangent and with dy + y (glu_dgrad_probe --cotangents), Mixtral and Qwen3, settled and
# interleaved (10 rounds).
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call7/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 480 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused,fused --cotangents given,from_output \
  --rounds 10 --time-budget-s 440 > $W/probe.log 2>&1; echo "probe rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'min' not in k})"
grep -a -i -B2 "error" $W/probe.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
