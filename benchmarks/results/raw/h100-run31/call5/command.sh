#!/usr/bin/env bash
# Session 31, H100 run 31 call 5 (<= 330 s): fused_backward settled, at a finer resolution than
# the interleaved rounds (call 4: the default against itself 1.0135x). variant_clock_probe (new
# --backend-variants) runs each variant alone in alternating 3 s phases with nvidia-smi read
# every 0.2 s: the default, fused_backward, and the default traced again (the probe's own
# noise), Mixtral fwd+bwd; then the default against fused_backward on Qwen3.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s31c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 170 python3 benchmarks/variant_clock_probe.py --out-dir $W/mixtral --preset mixtral \
  --variants '{}' --backend-variants '{"fused_backward": {"fused_backward": true}, "default_again": {}}' \
  --phases 15 > $W/mixtral.log 2>&1; echo "mixtral rc=$?"
timeout 120 python3 benchmarks/variant_clock_probe.py --out-dir $W/qwen3 --preset qwen3 \
  --variants '{}' --backend-variants '{"fused_backward": {"fused_backward": true}}' \
  --phases 10 > $W/qwen3.log 2>&1; echo "qwen3 rc=$?"
for p in mixtral qwen3; do python3 -c "
import json, statistics
rows = [r for r in json.load(open('$W/$p/variant-clock-probe.json'))['rows'] if 'variant' in r]
by = {}
for r in rows:
    print('$p', r['phase'], r['variant'], round(r['ms_per_call'], 4), r['sm_mhz'], r['power_w'])
    if r['phase'] > 0: by.setdefault(r['variant'], []).append(r['ms_per_call'])
base = statistics.median(by['default'])
for v, ms in by.items():
    print('$p', v, 'median ms', round(statistics.median(ms), 4), 'speedup', round(base / statistics.median(ms), 4))"; done
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
