#!/usr/bin/env bash
# Session 15, H100 run 16 call 5 (<= 520 s): the layer table with this session's defaults
# (split rows in the gmm and the fused gate/up kernel, the fused gate/up kernel on the ring, the
# input gradient as one kernel), settled; then the input-gradient pair's exactness, skewed.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s15c5; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 360 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
timeout 100 python3 benchmarks/input_dgrad_probe.py --out-dir $W --presets mixtral,qwen3 \
  --rounds 5 --time-budget-s 80 > $W/input-dgrad.log 2>&1; echo "input_dgrad rc=$?"
python3 -c "
import json
for r in json.load(open('$W/input-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'err' in k or 'zero' in k or k in ('preset', 'routing', 'speedup', 'error')})"
tar czf "$OUT/call.tgz" -C $W .
