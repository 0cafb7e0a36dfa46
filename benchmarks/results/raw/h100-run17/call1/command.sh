#!/usr/bin/env bash
# Session 16, H100 run 17 call 1 (<= 560 s): the Mosaic wgrad with the compute warpgroups
# splitting the output tile's rows (split_rows) against its default: smoke, exactness on the six
# shapes balanced and skewed, the kernel timed against torch (balanced), then the Mixtral and
# Qwen3 layers' fwd+bwd with each as the wgrad's tiles; then where Mixtral's fwd+bwd time goes.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s16c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
V=m64k128n256s4e64,m64k128n256s4e64split
timeout 150 python3 benchmarks/mosaic_wgrad_probe.py --out-dir $W/exact --phases smoke,exact \
  --variants $V --exact-variants m64k128n256s4e64split > $W/wgrad-exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-wgrad-probe.json | grep -v "'ok': True" | tail -12
grep -c "'ok': True" <(show $W/exact/mosaic-wgrad-probe.json)
timeout 200 python3 benchmarks/mosaic_wgrad_probe.py --out-dir $W/time --phases smoke,time,layer \
  --variants $V --routings balanced --presets mixtral,qwen3 --rounds 8 --time-budget-s 180 \
  > $W/wgrad-time.log 2>&1; echo "time rc=$?"
show $W/time/mosaic-wgrad-probe.json | grep -v "'phase': 'smoke'"
timeout 120 env XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 benchmarks/layer_profile.py \
  --presets mixtral --passes fwd+bwd --out-dir $W/profile > $W/profile.log 2>&1; echo "profile rc=$?"
cat $W/profile/*.md 2>/dev/null | head -45
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
