#!/usr/bin/env bash
# Session 30, H100 run 30 call 2 (<= 560 s), a fresh lease (call 1's was released). approx_math is now
# the default of the fused gated forward (default_gated_tiles) and of the fused down dgrad
# (default_down_dgrad_tiles).
# 1. The on-device profiler on the fused gated forward (Mixtral up, M = 2048): the default
#    against the swizzled epilogue for its three stores (the epilogue was still 4.8 us a tile).
# 2. gated_tiles_probe kernel phase: default, swizzled, exact (approx_math off), Mixtral, Qwen3.
# 3. glu_dgrad_probe layer phase: fused_backward (now with approx_math) against the default
#    unfused backward, fwd+bwd, the bench's cotangent and one from the output, Mixtral, Qwen3.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s30c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
for v in default swizzled; do
  changes='{}'; [ $v = swizzled ] && changes='{"swizzled_epilogue": true}'
  timeout 100 python3 benchmarks/kernel_trace_probe.py --out-dir $W/trace-$v --kernel gated \
    --cases mixtral-up:balanced --rows 2048 --changes "$changes" > $W/trace-$v.log 2>&1
  echo "trace $v rc=$?"
  python3 -c "
import json
for r in json.load(open('$W/trace-$v/kernel-trace.json'))['rows']:
    print('$v', r.get('error', ''), r.get('kernel_span_us'), r.get('share'), r.get('main_loop_us'), r.get('epilogue_us'))"
done
timeout 150 python3 benchmarks/gated_tiles_probe.py --out-dir $W --variants default,swizzled,exact \
  --presets mixtral,qwen3 --phases kernel --rounds 10 --time-budget-s 120 > $W/gated.log 2>&1
echo "gated rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gated-tiles-probe.json'))['rows']:
    print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if 'ms' in k or 'speedup' in k or 'diff' in k or k in ('phase', 'preset', 'error')})"
timeout 300 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral,qwen3 --layer-variants unfused,fused --cotangents given,from_output \
  --rounds 10 --time-budget-s 270 > $W/dgrad.log 2>&1; echo "dgrad rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'min' not in k})"
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
