#!/usr/bin/env bash
# Session 11, H100 call 1 (<= 590 s): (1) the Mosaic wgrad with a fourth ring slot (64-row
# epilogue halves) and two tile orders against the default and torch, six shapes, balanced and
# skewed, exactness of the new variant on all twelve cases; (2) what a 2-CTA cluster is worth
# on jax's dense Hopper kernel next to jaxmoe's gmm and torch; (3) the fused GLU on the ring with
# the swizzled epilogue after the aliased-slab fix (skewed exactness, timing).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s11c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $W/smi-start.txt 2>&1
timeout 240 python3 benchmarks/mosaic_wgrad_probe.py \
  --variants m64k128n256s3,m64k128n256s4e64,m64k128n256s4e64g4,m64k128n256s4e64g16 \
  --exact-variants m64k128n256s4e64 --time-budget-s 220 --out-dir $W > $W/wgrad.log 2>&1
echo "wgrad rc=$?"
grep -a '"impl"' $W/wgrad.log | cut -c1-260
timeout 150 python3 benchmarks/dense_mosaic_probe.py --time-budget-s 130 --out-dir $W > $W/dense.log 2>&1
echo "dense rc=$?"
grep -a '"impl"' $W/dense.log | cut -c1-260
timeout 170 python3 benchmarks/fused_glu_probe.py --shapes mixtral,dsv3,qwen3 --layers "" --ring \
  --time-budget-s 150 --out-dir $W > $W/glu-ring.log 2>&1
echo "glu ring rc=$?"
grep -a '"phase": "ring"' $W/glu-ring.log | cut -c1-900
tar czf "$OUT/call.tgz" -C $W .
