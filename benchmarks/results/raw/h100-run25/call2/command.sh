#!/usr/bin/env bash
# Session 25, call 2 (<= 560 s, one H100): half tiles (MosaicTileConfig.split_k_half_tiles).
#  1. mosaic_probe: smoke (fwd, dgrad; cut and empty groups) and exactness (balanced and skewed,
#     fwd and dgrad, against float32) of the default tiles with half tiles, without (hk) and
#     with (mchk) the weight multicast; then timing on the layer's kind of group sizes (64-row
#     padded multinomial loads: about half the groups end in a half tile), 6 rounds, against
#     the same tiles without (default, mc) and torch.
#  2. group_start_probe: the three layer presets, fwd and fwd+bwd, with half tiles in every
#     plain gmm (forward down projection, the fwd+bwd's up and gate projections, the dgrads)
#     against the default, outputs and gradients compared, settled interleaved rounds.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call2/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c2; rm -rf $W; mkdir -p $W/gemm $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 230 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases smoke,exact,time \
  --shapes mixtral-down,mixtral-up,qwen3-up,dsv3-up --variants default,hk,mc,mchk \
  --exact-variants hk,mchk --time-routing layer --rounds 6 --time-budget-s 150 \
  > $W/gemm.log 2>&1; echo "gemm rc=$?"
grep '^{' $W/gemm.log | grep -v '"phase": "exact", "impl": "triton"' | cut -c1-260 | tail -60
timeout 300 python3 benchmarks/group_start_probe.py --out-dir $W/layer --stem half-tiles \
  --sites gmm --presets mixtral,dsv3,qwen3 --rounds 8 --time-budget-s 280 \
  --variants '{"default": {}, "half_tiles": {"split_k_half_tiles": true}}' \
  > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-400
grep -a -i -B2 -A8 "error\|Traceback" $W/*.log $W/gemm/*.log 2>/dev/null | tail -30
tar czf "$OUT/call.tgz" -C $W .
