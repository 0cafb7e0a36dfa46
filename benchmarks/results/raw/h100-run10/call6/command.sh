#!/usr/bin/env bash
# Session 9, H100 call 6 (<= 300 s): where skewed Mixtral fwd+bwd loses to torch (call 4:
# 0.93x while the forward is 1.00x): the Mosaic wgrad (default and two other tilings), Triton's
# and torch's on skewed groups, Mixtral up/down and DeepSeek up.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c6; rm -rf $W; mkdir -p $W
timeout 280 python3 benchmarks/mosaic_wgrad_probe.py --shapes mixtral-up,mixtral-down,dsv3-up \
  --phases time --routings skewed --variants m64k128n256s3,m64k128n128s4,m128k128n128s3 \
  --time-budget-s 250 --out-dir $W > $W/wgrad.log 2>&1; echo "wgrad rc=$?"
grep -a '"impl"' $W/wgrad.log | cut -c1-300
tar czf "$OUT/call.tgz" -C $W .
