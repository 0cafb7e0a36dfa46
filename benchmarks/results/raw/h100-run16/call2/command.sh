#!/usr/bin/env bash
# Session 15, H100 run 16 call 2 (<= 560 s): the fused gate/up kernel on the hand-written ring
# (plain and with the swizzled epilogue) against its default (jax's pipeline per tile), the
# kernel and the layer's forward; then the fused input gradient in the layer again, 20 rounds.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s15c2; rm -rf $W; mkdir -p $W
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 300 python3 benchmarks/gated_tiles_probe.py --out-dir $W \
  --variants default,ring,ring_swizzled,ring3_swizzled --time-budget-s 240 > $W/gated.log 2>&1; echo "gated rc=$?"
show $W/gated-tiles-probe.json
timeout 220 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer --presets mixtral,qwen3 \
  --layer-variants unfused,input_dgrad --rounds 20 --time-budget-s 150 > $W/glu-layer.log 2>&1; echo "glu rc=$?"
show $W/glu-dgrad-probe.json
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
