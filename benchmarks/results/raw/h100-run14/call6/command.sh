#!/usr/bin/env bash
# Session 13, H100 call 6 (<= 590 s): the layer with 64-row expert padding (the new default on a
# Hopper) against 128 again, 20 interleaved rounds, three presets, fwd+bwd and fwd; then the
# layer table (torch, torchtitan, jaxmoe) on the new default.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s13c6; rm -rf $W /tmp/site; mkdir -p $W
export PYTHONPATH=src
timeout 290 python3 benchmarks/alignment_probe.py --out-dir $W --rounds 20 --time-budget-s 250 > $W/alignment.log 2>&1; echo "alignment rc=$?"
grep -a '^{' $W/alignment.log | cut -c1-600
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 270 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
