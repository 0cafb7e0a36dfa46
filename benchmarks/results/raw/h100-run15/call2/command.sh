#!/usr/bin/env bash
# Session 14, H100 run 15 call 2 (<= 560 s): how the clock follows the load (clock_probe: the
# Mixtral layer fwd+bwd and the Mixtral-up product, jaxmoe, torch and cuBLAS dense, from idle,
# after the peer's load and settled), then the layer table with each peer settled for 500 ms
# before each sample (the bench's new default on a GPU).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s14c2; rm -rf $W /tmp/site; mkdir -p $W
export PYTHONPATH=src
timeout 200 python3 benchmarks/clock_probe.py --out-dir $W > $W/clock.log 2>&1; echo "clock rc=$?"
grep -a '^{' $W/clock.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print({k: v for k, v in r.items() if not isinstance(v, list)})"
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 340 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
