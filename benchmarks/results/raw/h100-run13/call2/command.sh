#!/usr/bin/env bash
# Session 12, H100 call 2 (<= 590 s): call 1 found the fused backward exact but the layer
# 0.97-0.99x slower; this call times the fused dgrad kernel alone against the unfused path
# (default tiles and block_n 128) and the layer's variants (fused, unfused, fused block_n 128,
# the forward kernel writing the residuals), interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c2; rm -rf $W; mkdir -p $W
timeout 570 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --time-budget-s 480 > $W/glu-dgrad.log 2>&1; echo "glu rc=$?"
grep -a '^{' $W/glu-dgrad.log | cut -c1-1500
tar czf "$OUT/call.tgz" -C $W .
