#!/usr/bin/env bash
# Session 12, H100 call 1 (<= 590 s): the gated FFN's fused backward (the activation's
# derivative in the down projection's dgrad epilogue) against the unfused path: exactness on
# the three presets, balanced and skewed, kernel and layer fwd+bwd timed interleaved; then the
# FP8 rowwise checks (the Mosaic epilogue now runs a slab at a time) on one shape.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > $W/smi-start.txt 2>&1
timeout 400 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --time-budget-s 330 > $W/glu-dgrad.log 2>&1; echo "glu rc=$?"
grep -a '^{' $W/glu-dgrad.log | cut -c1-900
timeout 160 python3 benchmarks/grouped_matmul_fp8.py --shapes qwen3-down --out $W/fp8.json > $W/fp8.log 2>&1; echo "fp8 rc=$?"
tr '\r' '\n' < $W/fp8.log | grep -a -iE "err|check|fail|TFLOP" | tail -20
tar czf "$OUT/call.tgz" -C $W .
