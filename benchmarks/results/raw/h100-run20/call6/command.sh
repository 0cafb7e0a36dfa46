#!/usr/bin/env bash
# Session 20, call 6: call 5 had skip level with the default on balanced groups (0.98-1.01x), so
# the layer-like slowdown comes with the tiles one warpgroup multiplies alone. Every item a
# 64-row tile against every item a 128-row one (half_tile_probe.py, K 7168, N 2048, 64 groups).
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call6/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c6; rm -rf $W; mkdir -p $W
timeout 150 python3 benchmarks/half_tile_probe.py --out-dir $W > $W/probe.log 2>&1; echo "rc=$?"
tail -5 $W/probe.log
tar czf "$OUT/call.tgz" -C $W .
