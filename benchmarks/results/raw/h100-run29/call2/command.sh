#!/usr/bin/env bash
# Session 29, H100 run 29 call 2 (<= 560 s): the fused down dgrad with its epilogue operands on
# the ring (gate and up streamed into free ring slots after each tile's K steps,
# pallas_mosaic_ring_operands) instead of loaded from GPU memory in the epilogue (run 13: +0.31
# ms on Mixtral). Call 1 found XLA's activation backward at 406 us of Mixtral's 13.66 ms fwd+bwd.
# Kernel phase: exactness against float32 (balanced, skewed) and the fused kernel against the
# unfused dgrad + pass; layer phase: fwd+bwd fused against unfused, the bench's cotangent and
# one from the output (as in a model), Mixtral and Qwen3, interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s29c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 520 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases kernel,layer \
  --presets mixtral,qwen3 --layer-variants unfused,fused --cotangents given,from_output \
  --rounds 10 --time-budget-s 470 > $W/probe.log 2>&1; echo "probe rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'min' not in k})"
grep -a -i -B2 "error" $W/probe.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
