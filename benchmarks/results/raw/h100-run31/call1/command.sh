#!/usr/bin/env bash
# Session 31, H100 run 31 call 1 (<= 580 s): the fused down dgrad (fused_backward) with each
# result staged where its operand's block was read (new), against session 30's epilogue, which
# staged every store through the kernel's one swizzled slab pair, each store waiting for the one
# two before it to be read. .ab/old/src is session 30's src (git archive 1d0bbbb src).
# 1. glu_dgrad_probe kernel phase, old and new code in two processes: the fused kernel against
#    the unfused dgrad + XLA's pass (its own baseline in each), errors against float32 (on the
#    GPU this checks the in-place staging's ordering), tail rows zero. Mixtral, Qwen3.
# 2. Mosaic GPU's on-device profiler on the fused down dgrad (Mixtral down, M = 2048), old and
#    new: main loop against epilogue per tile.
# 3. glu_dgrad_probe layer phase (new code): fused_backward against the default, fwd+bwd,
#    Mixtral, the bench's cotangent and one from the output.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s31c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
summary() {
  python3 -c "
import json
for r in json.load(open('$1'))['rows']:
    print('$2', {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if 'ms' in k or 'speedup' in k or 'err' in k or 'zero' in k or k in ('phase', 'preset', 'routing', 'cotangent', 'error')})"
}
for v in new old; do
  src=src; [ $v = old ] && src=.ab/old/src
  mkdir -p $W/kernel-$v
  PYTHONPATH=$src timeout 120 python3 benchmarks/glu_dgrad_probe.py --out-dir $W/kernel-$v --phases kernel \
    --presets mixtral,qwen3 --kernel-variants fused --rounds 10 --time-budget-s 100 > $W/kernel-$v.log 2>&1
  echo "kernel $v rc=$?"
  summary $W/kernel-$v/glu-dgrad-probe.json $v
done
for v in new old; do
  src=src; [ $v = old ] && src=.ab/old/src
  PYTHONPATH=$src timeout 80 python3 benchmarks/kernel_trace_probe.py --out-dir $W/trace-$v --kernel down_dgrad \
    --cases mixtral-down:balanced --rows 2048 > $W/trace-$v.log 2>&1
  echo "trace $v rc=$?"
  python3 -c "
import json
for r in json.load(open('$W/trace-$v/kernel-trace.json'))['rows']:
    print('$v', r.get('error', ''), r.get('kernel_span_us'), r.get('share'), r.get('main_loop_us'), r.get('epilogue_us'))"
done
PYTHONPATH=src timeout 200 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer \
  --presets mixtral --layer-variants unfused,fused --cotangents given,from_output \
  --rounds 10 --time-budget-s 180 > $W/layer.log 2>&1; echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'min' not in k})"
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
find $W -name "*-trace.json" -size +1M -exec gzip {} \;
tar czf "$OUT/call.tgz" -C $W .
