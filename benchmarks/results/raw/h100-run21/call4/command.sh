#!/usr/bin/env bash
# Run 21 call 4: the default gmm's trace on the short-K shapes (Qwen3 up and down, DeepSeek
# down), balanced: how much of a tile the epilogue takes where the main loop is 12-32 K steps.
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c4; rm -rf $W; mkdir -p $W/default
CASES=qwen3-down:balanced,qwen3-up:balanced,dsv3-down:balanced
timeout 150 python3 benchmarks/kernel_trace_probe.py --out-dir $W/default --cases $CASES --profile-space 80 > $W/default/probe.log 2>&1; echo "default rc=$?"
grep '^{' $W/default/probe.log | cut -c1-900
tar czf "$OUT/call.tgz" -C $W .
