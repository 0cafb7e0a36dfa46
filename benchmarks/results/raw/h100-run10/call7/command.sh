#!/usr/bin/env bash
# Session 9, H100 call 7 (<= 300 s): the forward and dgrad alone on skewed groups (Mixtral up /
# down), torch, Triton, the default Mosaic tiles (s4e64ringswz) and the previous per-tile
# pipeline (s4e64): where call 4's skewed Mixtral fwd+bwd loss lies besides the wgrad's.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c7; rm -rf $W; mkdir -p $W
timeout 280 python3 benchmarks/mosaic_probe.py --shapes mixtral-up,mixtral-down --phases time \
  --time-routing skewed --variants s4e64ringswz,s4e64,s4e64ring --time-budget-s 250 \
  --out-dir $W > $W/probe.log 2>&1; echo "probe rc=$?"
grep -a '"phase": "time"' $W/probe.log | cut -c1-260
tar czf "$OUT/call.tgz" -C $W .
