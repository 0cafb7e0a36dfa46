#!/usr/bin/env bash
# Session 29, H100 run 29 call 5 (<= 400 s): the layer with the fused down dgrad, its epilogue
# operands on the ring and applied 64 columns at a time (call 4: the kernel 1.065x / 1.080x the
# unfused dgrad + pass on Mixtral / Qwen3, ptxas 8 bytes of spills), against the default
# (unfused backward): fwd+bwd, the bench's cotangent and one from the output (as in a model),
# Mixtral and Qwen3, interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s29c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 380 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused,fused --cotangents given,from_output \
  --rounds 10 --time-budget-s 290 > $W/probe.log 2>&1; echo "probe rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'min' not in k})"
grep -a -i -B2 "error" $W/probe.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
