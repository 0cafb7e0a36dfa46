#!/usr/bin/env bash
# Session 8, H100 call 8 (<= 420 s): the forward/dgrad kernel on the hand-written ring across a
# CTA's tiles (MosaicTileConfig.ring) against today's default (jax's pipeline per tile) and the
# chained pipeline: smoke, exactness of default+ring on the six shapes (balanced, skewed; poisoned
# outputs, tail rows), timing (balanced, fwd and dgrad, interleaved with torch and Triton).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w8; rm -rf $W; mkdir -p $W
timeout 400 python3 benchmarks/mosaic_probe.py --out-dir $W --time-budget-s 370 --exact-ring \
  --variants s4e64,s4e64chain,s4e64ring,s3ring,s4e64ringswz > $W/probe.log 2>&1; echo "probe rc=$?"
grep -a -o -E '"(phase|shape|routing|op|impl|ok|rel_err|ms|tflops|error)": [^,]*' $W/probe.log \
  | paste -sd' ' | sed 's/"phase"/\n"phase"/g' | cut -c1-200 | tail -90
tar czf "$OUT/call.tgz" -C $W .
