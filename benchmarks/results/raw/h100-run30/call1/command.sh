#!/usr/bin/env bash
# Session 30, H100 run 30 call 1 (<= 560 s): the fused gated kernels' epilogue math.
# MosaicTileConfig.approx_math (new): the activation's sigmoid as rsqrt(1 + 2^(-x log2 e))^2 on
# ex2.approx / rsqrt.approx, against lax.logistic's exact expf and IEEE division.
# 1. Mosaic GPU's on-device profiler on the fused gated forward (Mixtral up, M = 2048 so the
#    ranges fit): main loop against epilogue per tile, default and approx_math.
# 2. gated_tiles_probe: the fused gated forward, default against approx (kernel, then the layer's
#    forward), Mixtral and Qwen3, interleaved settled rounds; outputs' relative difference.
# 3. glu_dgrad_probe kernel phase: the fused down dgrad (fused_backward) with and without
#    approx_math against the unfused dgrad + XLA's pass, errors against float32.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s30c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
for v in default approx; do
  changes='{}'; [ $v = approx ] && changes='{"approx_math": true}'
  timeout 100 python3 benchmarks/kernel_trace_probe.py --out-dir $W/trace-$v --kernel gated \
    --cases mixtral-up:balanced --rows 2048 --changes "$changes" > $W/trace-$v.log 2>&1
  echo "trace $v rc=$?"
  python3 -c "
import json
for r in json.load(open('$W/trace-$v/kernel-trace.json'))['rows']:
    print('$v', r.get('error', ''), r.get('kernel_span_us'), r.get('share'), r.get('main_loop_us'), r.get('epilogue_us'))"
done
timeout 230 python3 benchmarks/gated_tiles_probe.py --out-dir $W --variants default,approx \
  --presets mixtral,qwen3 --phases kernel,layer --rounds 10 --time-budget-s 200 > $W/gated.log 2>&1
echo "gated rc=$?"
python3 -c "
import json
for r in json.load(open('$W/gated-tiles-probe.json'))['rows']:
    print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if 'ms' in k or 'speedup' in k or 'diff' in k or k in ('phase', 'preset', 'error')})"
timeout 150 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases kernel \
  --presets mixtral,qwen3 --kernel-variants fused,fused_approx --rounds 10 --time-budget-s 130 > $W/dgrad.log 2>&1
echo "dgrad rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if 'ms' in k or 'speedup' in k or 'err' in k or k in ('preset', 'routing')})"
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
