#!/usr/bin/env bash
# Session 15, H100 run 16 call 6 (<= 200 s): Qwen3's fwd+bwd row of the layer table, which call 5
# ran out of time for (same machine, still warm).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s15c6; rm -rf $W; mkdir -p $W
[ -d /tmp/site ] || pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1
export PYTHONPATH=src:/tmp/site
timeout 190 python3 -m jaxmoe bench layer --preset qwen3 --passes fwd+bwd \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -5
tar czf "$OUT/call.tgz" -C $W .
