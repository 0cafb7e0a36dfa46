#!/usr/bin/env bash
# Session 26, call 1 (<= 560 s, one GPU). Stream-K (MosaicTileConfig.stream_k): the last whole
# round of units and the partial one cut along K, float32 partial sums fixed up by one XLA
# scatter. (1) exactness of "sk" / "mc_sk" (the default tiles without / with the weight
# multicast, plus stream_k) on the six gemm shapes, balanced and skewed, fwd and dgrad, against
# float32, and their times on the layer's kind of groups next to "default" / "mc";
# (2) the layer with stream_k in the plain gmm's tiles (down projection, input-gradient pair)
# against today's default, the default timed twice as a control (session 25: up to 3% between
# identical programs); outputs and gradients compared between variants.
# Run from the repository root: bash benchmarks/results/raw/h100-run26/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s26c1; rm -rf $W; mkdir -p $W/gemm $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 250 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases smoke,exact,time \
  --shapes mixtral-down,mixtral-up,dsv3-up,dsv3-down,qwen3-up,qwen3-down --variants default,sk,mc,mc_sk \
  --exact-variants sk,mc_sk --time-routing layer --rounds 6 --time-budget-s 170 \
  > $W/gemm.log 2>&1; echo "gemm rc=$?"
grep '^{' $W/gemm.log | grep -v '"impl": "triton"' | cut -c1-260 | tail -80
timeout 290 python3 benchmarks/group_start_probe.py --out-dir $W/layer --stem stream-k \
  --sites gmm --presets mixtral,dsv3,qwen3 --rounds 8 --time-budget-s 270 \
  --variants '{"default": {}, "stream_k": {"stream_k": true}, "default_again": {}}' \
  > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-500
grep -a -i -B2 -A8 "error\|Traceback" $W/*.log $W/gemm/*.log 2>/dev/null | tail -30
tar czf "$OUT/call.tgz" -C $W .
