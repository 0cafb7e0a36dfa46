#!/usr/bin/env bash
# Session 12, H100 call 6 (<= 420 s): the FP8 wgrad with the bf16 wgrad's half slab (a fourth
# ring slot, Fp8TgmmTileConfig(stages=4, epilogue_rows=64)) against its default (3 slots, whole
# slab), the bf16 Mosaic wgrad and torch, interleaved; each FP8 variant checked against float32
# (NaN-poisoned output, empty groups zero).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c6; rm -rf $W; mkdir -p $W
timeout 380 python3 benchmarks/fp8_wgrad_probe.py --out-dir $W --half-slab \
  --shapes mixtral-up,dsv3-down,qwen3-up,qwen3-down > $W/fp8-wgrad.log 2>&1; echo "probe rc=$?"
grep -a "^{" $W/fp8-wgrad.log | cut -c1-600
tail -3 $W/fp8-wgrad.log
tar czf "$OUT/call.tgz" -C $W .
