#!/usr/bin/env bash
# Session 28, H100 run 28 call 7 (<= 240 s): does the weights' layout explain the forward's
# 0.98x? Call 6's SASS: our forward's wgmma read the weights MN-major (`tnspB`: [G, K, N], N
# contiguous, jax's natural layout), torch's bench hands torch._grouped_mm K-major weights
# ([G, N, K]) and its wgmma read them untransposed. Our dgrad reads [G, K, N] K-major, and our
# fwd+bwd rows stand better against torch's than our forwards do. Same phases as call 4:
# torch, jaxmoe (default) and the same kernel on [G, N, K] weights (transposed operand), on
# Mixtral down and up forwards, balanced.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s28c7; rm -rf $W; mkdir -p $W/down $W/up
for shape in down up; do
  timeout 100 python3 benchmarks/gemm_clock_probe.py --out-dir $W/$shape --shape mixtral-$shape \
    --kmajor --phases 9 > $W/$shape.log 2>&1; echo "$shape rc=$?"
  grep '^{' $W/$shape.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['phase'], r['variant'], round(r['ms_per_call'], 4), r['sm_mhz'], r['power_w'], round(r.get('mcycles_per_call') or 0, 3))"
done
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
